// cuDNN convolution and pooling (see core/conv_kernels.h). Descriptors are built per call (cheap next
// to the convolution); algorithms come from cuDNN's heuristics, restricted to deterministic ones for
// the backward passes so that training runs repeat bit for bit. Work goes on the current stream,
// and workspaces come from the stream-ordered pool, so they are reused only after the call finishes.
#include <cudnn.h>

#include <vector>

#include "core/conv_kernels.h"
#include "core/cuda/check.h"
#include "core/cuda/handles.h"
#include "core/cuda/stream.h"
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace dpt::conv::cudnn {

namespace {

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    case DType::Float16: return CUDNN_DATA_HALF;
    default: DPT_FAIL("cuDNN convolution: unsupported dtype {}", dtype_name(dtype));
  }
}

// Accumulation type: float for float32, bfloat16 and float16, double for float64.
cudnnDataType_t compute_type(DType dtype) { return dtype == DType::Float64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

// alpha = 1, beta = 0 in the scaling type cuDNN expects (double for double data, float otherwise).
struct Scaling {
  float f1 = 1.f, f0 = 0.f;
  double d1 = 1.0, d0 = 0.0;
  const void* one(DType t) const { return t == DType::Float64 ? static_cast<const void*>(&d1) : &f1; }
  const void* zero(DType t) const { return t == DType::Float64 ? static_cast<const void*>(&d0) : &f0; }
};

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(DType dtype, int64_t n, int64_t c, int64_t h, int64_t w) {
    DPT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    DPT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, data_type(dtype), static_cast<int>(n),
                                               static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(DType dtype, const Geometry& g) {
    DPT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    DPT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d, data_type(dtype), CUDNN_TENSOR_NCHW, static_cast<int>(g.o),
                                               static_cast<int>(g.c), static_cast<int>(g.kh), static_cast<int>(g.kw)));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc(DType dtype, const Geometry& g) {
    DPT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    const int pad = static_cast<int>(g.padding), stride = static_cast<int>(g.stride);
    DPT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, pad, pad, stride, stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                    compute_type(dtype)));
    // float32 stays IEEE (no TF32) unless the user allowed TF32 for matmuls too; bf16 and fp16 use
    // tensor cores.
    cudnnMathType_t math = CUDNN_FMA_MATH;
    if (dtype == DType::BFloat16 || dtype == DType::Float16) math = CUDNN_TENSOR_OP_MATH;
    if (dtype == DType::Float32 && dpt::cuda::allow_tf32()) math = CUDNN_DEFAULT_MATH;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// A stream-ordered scratch buffer from the device pool.
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  int device = 0;
  Workspace(size_t n, int dev) : bytes(n), device(dev) {
    if (n > 0) ptr = dpt::cuda::allocate(n, dev);
  }
  ~Workspace() {
    if (ptr) dpt::cuda::deallocate(ptr, bytes, device);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
};

// The first heuristic choice that succeeded (and, when asked, is deterministic).
template <class Perf>
const Perf& pick(const std::vector<Perf>& perfs, int count, bool deterministic, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (perfs[static_cast<size_t>(i)].status != CUDNN_STATUS_SUCCESS) continue;
    if (deterministic && perfs[static_cast<size_t>(i)].determinism != CUDNN_DETERMINISTIC) continue;
    return perfs[static_cast<size_t>(i)];
  }
  DPT_FAIL("cuDNN found no {} {} algorithm for this convolution", deterministic ? "deterministic" : "usable", what);
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Geometry& g) {
  const DType t = x.dtype();
  const int device = x.device().index;
  cudnnHandle_t handle = dpt::cuda::cudnn_handle(device);
  TensorDesc xd(t, g.n, g.c, g.h, g.w), yd(t, g.n, g.o, g.ho, g.wo);
  FilterDesc wd(t, g);
  ConvDesc cd(t, g);
  int max_algos = 0, count = 0;
  DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_algos));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(static_cast<size_t>(max_algos));
  DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, xd.d, wd.d, cd.d, yd.d, max_algos, &count, perfs.data()));
  const auto& algo = pick(perfs, count, false, "forward");
  Workspace ws(algo.memory, device);
  Scaling s;
  DPT_CUDNN_CHECK(cudnnConvolutionForward(handle, s.one(t), xd.d, x.data_ptr(), wd.d, w.data_ptr(), cd.d, algo.algo,
                                          ws.ptr, ws.bytes, s.zero(t), yd.d, y.data_ptr()));
}

void conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Geometry& g) {
  const DType t = dy.dtype();
  const int device = dy.device().index;
  cudnnHandle_t handle = dpt::cuda::cudnn_handle(device);
  TensorDesc dxd(t, g.n, g.c, g.h, g.w), dyd(t, g.n, g.o, g.ho, g.wo);
  FilterDesc wd(t, g);
  ConvDesc cd(t, g);
  int max_algos = 0, count = 0;
  DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_algos));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(static_cast<size_t>(max_algos));
  DPT_CUDNN_CHECK(
      cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, wd.d, dyd.d, cd.d, dxd.d, max_algos, &count, perfs.data()));
  const auto& algo = pick(perfs, count, true, "backward-data");
  Workspace ws(algo.memory, device);
  Scaling s;
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, s.one(t), wd.d, w.data_ptr(), dyd.d, dy.data_ptr(), cd.d,
                                               algo.algo, ws.ptr, ws.bytes, s.zero(t), dxd.d, dx.data_ptr()));
}

void conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw, const Geometry& g) {
  const DType t = x.dtype();
  const int device = x.device().index;
  cudnnHandle_t handle = dpt::cuda::cudnn_handle(device);
  TensorDesc xd(t, g.n, g.c, g.h, g.w), dyd(t, g.n, g.o, g.ho, g.wo);
  FilterDesc wd(t, g);
  ConvDesc cd(t, g);
  int max_algos = 0, count = 0;
  DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_algos));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perfs(static_cast<size_t>(max_algos));
  DPT_CUDNN_CHECK(
      cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, xd.d, dyd.d, cd.d, wd.d, max_algos, &count, perfs.data()));
  const auto& algo = pick(perfs, count, true, "backward-filter");
  Workspace ws(algo.memory, device);
  Scaling s;
  DPT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, s.one(t), xd.d, x.data_ptr(), dyd.d, dy.data_ptr(), cd.d,
                                                 algo.algo, ws.ptr, ws.bytes, s.zero(t), wd.d, dw.data_ptr()));
}

namespace {
struct PoolDesc {
  cudnnPoolingDescriptor_t d = nullptr;
  PoolDesc(bool max, const Geometry& g) {
    DPT_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d));
    // Average counts the zero padding in the divisor, as PyTorch's default; max propagates NaN.
    cudnnPoolingMode_t mode = max ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    const int k = static_cast<int>(g.kh), p = static_cast<int>(g.padding), s = static_cast<int>(g.stride);
    DPT_CUDNN_CHECK(cudnnSetPooling2dDescriptor(d, mode, CUDNN_PROPAGATE_NAN, k, k, p, p, s, s));
  }
  ~PoolDesc() { cudnnDestroyPoolingDescriptor(d); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
};
}  // namespace

void pool2d_forward(bool max, const Tensor& x, const Tensor& y, const Geometry& g) {
  const DType t = x.dtype();
  cudnnHandle_t handle = dpt::cuda::cudnn_handle(x.device().index);
  TensorDesc xd(t, g.n, g.c, g.h, g.w), yd(t, g.n, g.c, g.ho, g.wo);
  PoolDesc pd(max, g);
  Scaling s;
  DPT_CUDNN_CHECK(cudnnPoolingForward(handle, pd.d, s.one(t), xd.d, x.data_ptr(), s.zero(t), yd.d, y.data_ptr()));
}

void pool2d_backward(bool max, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                     const Geometry& g) {
  const DType t = x.dtype();
  cudnnHandle_t handle = dpt::cuda::cudnn_handle(x.device().index);
  TensorDesc xd(t, g.n, g.c, g.h, g.w), yd(t, g.n, g.c, g.ho, g.wo);
  PoolDesc pd(max, g);
  Scaling s;
  DPT_CUDNN_CHECK(cudnnPoolingBackward(handle, pd.d, s.one(t), yd.d, y.data_ptr(), yd.d, dy.data_ptr(), xd.d,
                                       x.data_ptr(), s.zero(t), xd.d, dx.data_ptr()));
}

}  // namespace dpt::conv::cudnn
