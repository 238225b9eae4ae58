// Elementwise kernels: unary maps (vectorised 16-byte loads on contiguous data) and broadcasting binary
// maps (a contiguous fast path, else strided offsets from a simplified shape). Arithmetic is in float32
// for bfloat16 and float32, float64 for float64, integers for integer binary ops — as on the CPU.
#include "core/cuda/cuda_kernels.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/strided.cuh"

namespace dpt::cuda_kernels {

namespace {

// Math in the compute type: float overloads for float, double ones for double.
template <class C>
__device__ __forceinline__ C d_exp(C x) {
  if constexpr (std::is_same_v<C, float>)
    return expf(x);
  else
    return exp(x);
}
template <class C>
__device__ __forceinline__ C d_log(C x) {
  if constexpr (std::is_same_v<C, float>)
    return logf(x);
  else
    return log(x);
}
template <class C>
__device__ __forceinline__ C d_sqrt(C x) {
  if constexpr (std::is_same_v<C, float>)
    return sqrtf(x);
  else
    return sqrt(x);
}
template <class C>
__device__ __forceinline__ C d_pow(C x, C e) {
  if constexpr (std::is_same_v<C, float>)
    return powf(x, e);
  else
    return pow(x, e);
}
template <class C>
__device__ __forceinline__ C d_tanh(C x) {
  if constexpr (std::is_same_v<C, float>)
    return tanhf(x);
  else
    return tanh(x);
}

// GELU, tanh form (GPT-2): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), and its derivative
// 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u).
template <UnaryOp Op, class C>
__device__ __forceinline__ C apply_unary(C x, C s) {
  const C k = static_cast<C>(0.7978845608028654), c = static_cast<C>(0.044715);
  if constexpr (Op == UnaryOp::Neg) return -x;
  if constexpr (Op == UnaryOp::Exp) return d_exp(x);
  if constexpr (Op == UnaryOp::Log) return d_log(x);
  if constexpr (Op == UnaryOp::Sqrt) return d_sqrt(x);
  if constexpr (Op == UnaryOp::Pow) return d_pow(x, s);
  if constexpr (Op == UnaryOp::Relu) return x > C(0) ? x : C(0);
  if constexpr (Op == UnaryOp::Gelu) return C(0.5) * x * (C(1) + d_tanh(k * (x + c * x * x * x)));
  if constexpr (Op == UnaryOp::Tanh) return d_tanh(x);
  if constexpr (Op == UnaryOp::Sigmoid) return C(1) / (C(1) + d_exp(-x));
  if constexpr (Op == UnaryOp::Sign) return x > C(0) ? C(1) : x < C(0) ? C(-1) : x;  // x keeps 0 and NaN
  if constexpr (Op == UnaryOp::Abs) return x < C(0) ? -x : x;
  if constexpr (Op == UnaryOp::ReluGrad) return x > C(0) ? C(1) : C(0);
  if constexpr (Op == UnaryOp::GeluGrad) {
    const C t = d_tanh(k * (x + c * x * x * x));
    return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(3) * c * x * x);
  }
  if constexpr (Op == UnaryOp::Scale) return x * s;
  if constexpr (Op == UnaryOp::AddScalar) return x + s;
  return x;
}

template <class T, UnaryOp Op, int V>
__global__ void unary_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, Compute<T> s) {
  using C = Compute<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  const auto* vin = reinterpret_cast<const Vec<T, V>*>(in);
  auto* vout = reinterpret_cast<Vec<T, V>*>(out);
  for (int64_t i = first; i < nvec; i += stride) {
    Vec<T, V> x = vin[i], y;
#pragma unroll
    for (int j = 0; j < V; ++j) y.v[j] = convert<T>(apply_unary<Op>(convert<C>(x.v[j]), s));
    vout[i] = y;
  }
  for (int64_t i = nvec * V + first; i < n; i += stride) out[i] = convert<T>(apply_unary<Op>(convert<C>(in[i]), s));
}

template <class T, UnaryOp Op>
void launch_unary(const Tensor& in, const Tensor& out, double scalar, int device) {
  const int64_t n = out.numel();
  const T* x = ptr<const T>(in);
  T* y = ptr<T>(out);
  const auto s = static_cast<Compute<T>>(scalar);
  cudaStream_t stream = cuda::current_stream(device);
  constexpr int V = vec_width<T>();
  if (aligned16(x) && aligned16(y)) {
    unary_kernel<T, Op, V><<<grid_for((n + V - 1) / V, device), kThreads, 0, stream>>>(x, y, n, s);
  } else {
    unary_kernel<T, Op, 1><<<grid_for(n, device), kThreads, 0, stream>>>(x, y, n, s);
  }
  DPT_CUDA_CHECK_LAUNCH();
}

template <class T>
void unary_typed(UnaryOp op, const Tensor& in, const Tensor& out, double s, int device) {
  switch (op) {
    case UnaryOp::Neg:
      return launch_unary<T, UnaryOp::Neg>(in, out, s, device);
    case UnaryOp::Exp:
      return launch_unary<T, UnaryOp::Exp>(in, out, s, device);
    case UnaryOp::Log:
      return launch_unary<T, UnaryOp::Log>(in, out, s, device);
    case UnaryOp::Sqrt:
      return launch_unary<T, UnaryOp::Sqrt>(in, out, s, device);
    case UnaryOp::Pow:
      return launch_unary<T, UnaryOp::Pow>(in, out, s, device);
    case UnaryOp::Relu:
      return launch_unary<T, UnaryOp::Relu>(in, out, s, device);
    case UnaryOp::Gelu:
      return launch_unary<T, UnaryOp::Gelu>(in, out, s, device);
    case UnaryOp::Tanh:
      return launch_unary<T, UnaryOp::Tanh>(in, out, s, device);
    case UnaryOp::Sigmoid:
      return launch_unary<T, UnaryOp::Sigmoid>(in, out, s, device);
    case UnaryOp::Sign:
      return launch_unary<T, UnaryOp::Sign>(in, out, s, device);
    case UnaryOp::Abs:
      return launch_unary<T, UnaryOp::Abs>(in, out, s, device);
    case UnaryOp::ReluGrad:
      return launch_unary<T, UnaryOp::ReluGrad>(in, out, s, device);
    case UnaryOp::GeluGrad:
      return launch_unary<T, UnaryOp::GeluGrad>(in, out, s, device);
    case UnaryOp::Scale:
      return launch_unary<T, UnaryOp::Scale>(in, out, s, device);
    case UnaryOp::AddScalar:
      return launch_unary<T, UnaryOp::AddScalar>(in, out, s, device);
  }
  DPT_FAIL("unary kernel (CUDA): unknown op {}", static_cast<int>(op));
}

// --- binary -----------------------------------------------------------------------------------------

template <BinaryOp Op, class C>
__device__ __forceinline__ C apply_binary(C a, C b) {
  if constexpr (Op == BinaryOp::Add) return a + b;
  if constexpr (Op == BinaryOp::Sub) return a - b;
  if constexpr (Op == BinaryOp::Mul) return a * b;
  if constexpr (Op == BinaryOp::Div) return a / b;
  return a;
}

template <class T>
using BinaryCompute = std::conditional_t<std::is_integral_v<T>, T, Compute<T>>;

template <class T, BinaryOp Op, int V>
__global__ void binary_contiguous_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                         int64_t n) {
  using C = BinaryCompute<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = first; i < nvec; i += stride) {
    Vec<T, V> x = reinterpret_cast<const Vec<T, V>*>(a)[i], y = reinterpret_cast<const Vec<T, V>*>(b)[i], z;
#pragma unroll
    for (int j = 0; j < V; ++j) z.v[j] = convert<T>(apply_binary<Op>(convert<C>(x.v[j]), convert<C>(y.v[j])));
    reinterpret_cast<Vec<T, V>*>(out)[i] = z;
  }
  for (int64_t i = nvec * V + first; i < n; i += stride) {
    out[i] = convert<T>(apply_binary<Op>(convert<C>(a[i]), convert<C>(b[i])));
  }
}

template <class T, BinaryOp Op, class I>
__global__ void binary_strided_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, I n,
                                      StridedShape<2> shape) {
  using C = BinaryCompute<T>;
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[2];
    shape.offsets(i, off);
    out[i] = convert<T>(apply_binary<Op>(convert<C>(a[off[0]]), convert<C>(b[off[1]])));
  }
}

// The strided walk, V output elements per step along a vectorizable innermost dim (inner_vectorizable):
// an operand with inner stride 1 loads a vector, one with stride 0 loads a scalar and repeats it.
template <class T, BinaryOp Op, int V, class I>
__global__ void binary_strided_vec_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, I nvec,
                                          StridedShape<2> shape, bool a_vec, bool b_vec) {
  using C = BinaryCompute<T>;
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I iv = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; iv < nvec; iv += stride) {
    int64_t off[2];
    shape.offsets(iv * V, off);
    Vec<T, V> x, y, z;
    if (a_vec) {
      x = *reinterpret_cast<const Vec<T, V>*>(a + off[0]);
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q) x.v[q] = a[off[0]];
    }
    if (b_vec) {
      y = *reinterpret_cast<const Vec<T, V>*>(b + off[1]);
    } else {
#pragma unroll
      for (int q = 0; q < V; ++q) y.v[q] = b[off[1]];
    }
#pragma unroll
    for (int q = 0; q < V; ++q) z.v[q] = convert<T>(apply_binary<Op>(convert<C>(x.v[q]), convert<C>(y.v[q])));
    reinterpret_cast<Vec<T, V>*>(out)[iv] = z;
  }
}

template <class T, BinaryOp Op>
void launch_binary(const Tensor& a, const Tensor& b, const Tensor& out, int device) {
  const int64_t n = out.numel();
  const T* pa = ptr<const T>(a);
  const T* pb = ptr<const T>(b);
  T* po = ptr<T>(out);
  cudaStream_t stream = cuda::current_stream(device);
  if (a.is_contiguous() && b.is_contiguous()) {
    constexpr int V = vec_width<T>();
    if (aligned16(pa) && aligned16(pb) && aligned16(po)) {
      binary_contiguous_kernel<T, Op, V><<<grid_for((n + V - 1) / V, device), kThreads, 0, stream>>>(pa, pb, po, n);
    } else {
      binary_contiguous_kernel<T, Op, 1><<<grid_for(n, device), kThreads, 0, stream>>>(pa, pb, po, n);
    }
  } else {
    StridedShape<2> shape = make_strided_shape<2>(out.shape(), {&a.strides(), &b.strides()}, "binary kernel");
    constexpr int V = vec_width<T>();
    if (aligned16(po) && inner_vectorizable<2>(shape, {pa, pb}, V, sizeof(T))) {
      // Bias adds and other broadcasts along rows: one offset computation per 16 bytes of output.
      const int64_t nvec = n / V;
      const bool a_vec = shape.strides[0][shape.ndim - 1] == 1, b_vec = shape.strides[1][shape.ndim - 1] == 1;
      if (n < (int64_t{1} << 31)) {
        binary_strided_vec_kernel<T, Op, V, uint32_t><<<grid_for(nvec, device), kThreads, 0, stream>>>(
            pa, pb, po, static_cast<uint32_t>(nvec), shape, a_vec, b_vec);
      } else {
        binary_strided_vec_kernel<T, Op, V, int64_t>
            <<<grid_for(nvec, device), kThreads, 0, stream>>>(pa, pb, po, nvec, shape, a_vec, b_vec);
      }
      DPT_CUDA_CHECK_LAUNCH();
      return;
    }
    // 32-bit index arithmetic when it fits: integer division is the cost of this kernel.
    if (n < (int64_t{1} << 31)) {
      binary_strided_kernel<T, Op, uint32_t>
          <<<grid_for(n, device), kThreads, 0, stream>>>(pa, pb, po, static_cast<uint32_t>(n), shape);
    } else {
      binary_strided_kernel<T, Op, int64_t><<<grid_for(n, device), kThreads, 0, stream>>>(pa, pb, po, n, shape);
    }
  }
  DPT_CUDA_CHECK_LAUNCH();
}

// --- where -----------------------------------------------------------------------------------------

// One strided walk over three operands; a select is cheap enough that the offsets dominate, so there is
// no contiguous fast path to keep in step with the CPU.
template <class T, class I>
__global__ void where_kernel(const T* __restrict__ cond, const T* __restrict__ a, const T* __restrict__ b,
                             T* __restrict__ out, I n, StridedShape<3> shape) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[3];
    shape.offsets(i, off);
    out[i] = convert<float>(cond[off[0]]) != 0.0f ? a[off[1]] : b[off[2]];
  }
}

}  // namespace

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  DPT_CHECK(cond.dtype() == out.dtype() && a.dtype() == out.dtype() && b.dtype() == out.dtype(),
            "where kernel (CUDA): dtypes {}, {} and {} into {}", dtype_name(cond.dtype()), dtype_name(a.dtype()),
            dtype_name(b.dtype()), dtype_name(out.dtype()));
  DPT_CHECK(cond.shape() == out.shape() && a.shape() == out.shape() && b.shape() == out.shape() && out.is_contiguous(),
            "where kernel (CUDA): operands {}, {} and {} must be views broadcast to the contiguous output {}",
            shape_str(cond.shape()), shape_str(a.shape()), shape_str(b.shape()), shape_str(out.shape()));
  const int device = device_of(out, {&cond, &a, &b}, "where kernel");
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  StridedShape<3> shape =
      make_strided_shape<3>(out.shape(), {&cond.strides(), &a.strides(), &b.strides()}, "where kernel");
  cudaStream_t stream = cuda::current_stream(device);
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pc = ptr<const T>(cond);
    const T* pa = ptr<const T>(a);
    const T* pb = ptr<const T>(b);
    T* po = ptr<T>(out);
    if (n < (int64_t{1} << 31)) {
      where_kernel<T, uint32_t>
          <<<grid_for(n, device), kThreads, 0, stream>>>(pc, pa, pb, po, static_cast<uint32_t>(n), shape);
    } else {
      where_kernel<T, int64_t><<<grid_for(n, device), kThreads, 0, stream>>>(pc, pa, pb, po, n, shape);
    }
    DPT_CUDA_CHECK_LAUNCH();
  });
}

void unary(UnaryOp op, const Tensor& in, const Tensor& out, double scalar) {
  DPT_CHECK(in.dtype() == out.dtype() && in.shape() == out.shape() && in.is_contiguous() && out.is_contiguous(),
            "unary kernel (CUDA): expected contiguous in/out of equal shape and dtype, found {} {} and {} {}",
            shape_str(in.shape()), dtype_name(in.dtype()), shape_str(out.shape()), dtype_name(out.dtype()));
  const int device = device_of(out, {&in}, "unary kernel");
  if (out.numel() == 0) return;
  cuda::DeviceGuard guard(device);
  visit_floating(out.dtype(), "unary kernel", [&](auto tag) {
    using T = decltype(tag);
    unary_typed<T>(op, in, out, scalar, device);
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  DPT_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "binary kernel (CUDA): dtypes {} and {} into {}",
            dtype_name(a.dtype()), dtype_name(b.dtype()), dtype_name(out.dtype()));
  DPT_CHECK(a.shape() == out.shape() && b.shape() == out.shape() && out.is_contiguous(),
            "binary kernel (CUDA): operands {} and {} must be views broadcast to the contiguous output {}",
            shape_str(a.shape()), shape_str(b.shape()), shape_str(out.shape()));
  const int device = device_of(out, {&a, &b}, "binary kernel");
  if (out.numel() == 0) return;
  cuda::DeviceGuard guard(device);
  visit_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case BinaryOp::Add:
        return launch_binary<T, BinaryOp::Add>(a, b, out, device);
      case BinaryOp::Sub:
        return launch_binary<T, BinaryOp::Sub>(a, b, out, device);
      case BinaryOp::Mul:
        return launch_binary<T, BinaryOp::Mul>(a, b, out, device);
      case BinaryOp::Div:
        return launch_binary<T, BinaryOp::Div>(a, b, out, device);
    }
    DPT_FAIL("binary kernel (CUDA): unknown op {}", static_cast<int>(op));
  });
}

}  // namespace dpt::cuda_kernels
