// The activation's backward for dpt::linear when it cannot ride in a GEMM epilogue: one pass,
// grad_pre = grad_out * act'(saved), in float, rounded once (the unfused ops take two passes and two
// roundings: act'(x) into a temporary, then the product).
//   GELU (tanh form, GPT-2): act'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
//   t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), `saved` = the pre-activation x — the formula of core's
//   GeluGrad kernel.
//   ReLU: act'(x) = [x > 0] = [relu(x) > 0], `saved` = the activation's output.
#include <algorithm>

#include "core/cuda/gemm_lt.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/kernel_profiler.h"

namespace dpt::cuda_kernels {

namespace {

template <class T, LtActivation Act>
__device__ __forceinline__ T activation_backward_one(T grad_out, T saved) {
  using C = Compute<T>;
  const C k = static_cast<C>(0.7978845608028654), c = static_cast<C>(0.044715);
  const C g = convert<C>(grad_out), x = convert<C>(saved);
  C d;
  if constexpr (Act == LtActivation::Gelu) {
    const C t = tanh(k * (x + c * x * x * x));
    d = C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(3) * c * x * x);
  } else {
    d = x > C(0) ? C(1) : C(0);
  }
  return convert<T>(g * d);
}

// V elements per access (16 bytes when all three pointers are 16-byte aligned): the pass is bound by
// its 3 n elements of traffic, and 2-byte accesses left GPT-2's 50M-element GELU backward at ~2/3 of
// the bandwidth a 16-byte access reaches. Per element the arithmetic is the same either way.
template <class T, LtActivation Act, int V>
__global__ void activation_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ saved,
                                           T* __restrict__ grad_pre, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = first; i < nvec; i += stride) {
    const Vec<T, V> g = reinterpret_cast<const Vec<T, V>*>(grad_out)[i];
    const Vec<T, V> x = reinterpret_cast<const Vec<T, V>*>(saved)[i];
    Vec<T, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = activation_backward_one<T, Act>(g.v[j], x.v[j]);
    reinterpret_cast<Vec<T, V>*>(grad_pre)[i] = r;
  }
  for (int64_t i = nvec * V + first; i < n; i += stride) {
    grad_pre[i] = activation_backward_one<T, Act>(grad_out[i], saved[i]);
  }
}

// The same pass over an [m, n] gradient that also produces the bias gradient db = sum over rows of
// grad_pre, so dW's GEMM needs no BGRADB epilogue (cuBLASLt runs that as a separate kernel re-reading
// grad_pre). Block (kColLanes, kRowLanes): thread x owns V adjacent columns of the block's kColLanes V-column
// tile, thread y every kRowLanes-th row of the block's row chunk; each keeps V float sums of the *rounded*
// grad_pre (what the unfused path sums), the kRowLanes partial rows are added in shared memory in a fixed
// order, and column_partials_sum adds the chunks: deterministic, no atomics. A thread loads kRowsInFlight
// rows before it computes any of them and still adds its rows in order; with blocks of 128 threads this ran
// faster than one row at a time or blocks of 256 at every width measured.
constexpr int kColLanes = 16;
constexpr int kRowLanes = 8;
constexpr int kRowsInFlight = 4;

template <class T, LtActivation Act, int V>
__global__ void __launch_bounds__(kColLanes * kRowLanes)
    activation_backward_bias_kernel(const T* __restrict__ grad_out, const T* __restrict__ saved,
                                    T* __restrict__ grad_pre, float* __restrict__ partial, int64_t m, int64_t n,
                                    int64_t rows_per_chunk) {
  __shared__ float sums[kRowLanes][kColLanes * V];
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kColLanes + threadIdx.x) * V;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t last = min(m, first + rows_per_chunk);
  float acc[V] = {};
  if (col < n) {
    for (int64_t r0 = first + threadIdx.y; r0 < last; r0 += kRowsInFlight * kRowLanes) {
      Vec<T, V> g[kRowsInFlight], x[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const int64_t r = r0 + u * kRowLanes;
        if (r < last) {
          g[u] = reinterpret_cast<const Vec<T, V>*>(grad_out)[(r * n + col) / V];
          x[u] = reinterpret_cast<const Vec<T, V>*>(saved)[(r * n + col) / V];
        }
      }
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const int64_t r = r0 + u * kRowLanes;
        if (r < last) {
          Vec<T, V> out;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            out.v[j] = activation_backward_one<T, Act>(g[u].v[j], x[u].v[j]);
            acc[j] += convert<float>(out.v[j]);
          }
          reinterpret_cast<Vec<T, V>*>(grad_pre)[(r * n + col) / V] = out;
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) sums[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float total = 0.f;
      for (int y = 0; y < kRowLanes; ++y) total += sums[y][threadIdx.x * V + j];
      partial[blockIdx.y * n + col + j] = total;
    }
  }
}

// bias_grad[c] = sum over chunks of partial[chunk, c], in chunk order.
template <class T>
__global__ void column_partials_sum_kernel(const float* __restrict__ partial, T* __restrict__ bias_grad,
                                           int64_t chunks, int64_t n) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float total = 0.f;
  for (int64_t k = 0; k < chunks; ++k) total += partial[k * n + c];
  bias_grad[c] = convert<T>(total);
}

}  // namespace

void activation_backward(const Tensor& grad_out, const Tensor& saved, const Tensor& grad_pre, LtActivation act) {
  DPT_CHECK(grad_out.is_contiguous() && saved.is_contiguous() && grad_pre.is_contiguous() &&
                grad_out.numel() == grad_pre.numel() && saved.numel() == grad_pre.numel() &&
                grad_out.dtype() == grad_pre.dtype() && saved.dtype() == grad_pre.dtype(),
            "activation_backward (CUDA): expected three contiguous tensors of one size and dtype, found {} {}, {} {}, "
            "{} {}",
            shape_str(grad_out.shape()), dtype_name(grad_out.dtype()), shape_str(saved.shape()),
            dtype_name(saved.dtype()), shape_str(grad_pre.shape()), dtype_name(grad_pre.dtype()));
  const int device = device_of(grad_pre, {&grad_out, &saved}, "activation_backward");
  const int64_t n = grad_pre.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(device);
  KernelTimer timer("linear_activation_backward", true);
  cudaStream_t stream = cuda::current_stream(device);
  visit_floating(grad_pre.dtype(), "activation_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T>();
    const bool vec = aligned16(grad_out.data_ptr()) && aligned16(saved.data_ptr()) && aligned16(grad_pre.data_ptr());
    auto run = [&](auto kernel, int width) {
      kernel<<<grid_for((n + width - 1) / width, device), kThreads, 0, stream>>>(ptr<const T>(grad_out),
                                                                             ptr<const T>(saved), ptr<T>(grad_pre), n);
    };
    if (act == LtActivation::Gelu) {
      if (vec) run(activation_backward_kernel<T, LtActivation::Gelu, V>, V);
      else run(activation_backward_kernel<T, LtActivation::Gelu, 1>, 1);
    } else {
      if (vec) run(activation_backward_kernel<T, LtActivation::Relu, V>, V);
      else run(activation_backward_kernel<T, LtActivation::Relu, 1>, 1);
    }
    DPT_CUDA_CHECK_LAUNCH();
  });
}

bool activation_backward_bias(const Tensor& grad_out, const Tensor& saved, const Tensor& grad_pre,
                              const Tensor& bias_grad, LtActivation act) {
  if (grad_pre.dtype() != DType::BFloat16 || grad_pre.dim() != 2 || !grad_out.is_contiguous() ||
      !saved.is_contiguous() || !grad_pre.is_contiguous() || grad_out.numel() != grad_pre.numel() ||
      saved.numel() != grad_pre.numel() || grad_out.dtype() != grad_pre.dtype() || saved.dtype() != grad_pre.dtype() ||
      bias_grad.dtype() != grad_pre.dtype() || !bias_grad.is_contiguous() || bias_grad.numel() != grad_pre.size(1))
    return false;
  using T = bf16_t;
  constexpr int V = vec_width<T>();
  const int64_t m = grad_pre.size(0), n = grad_pre.size(1);
  // Every row starts on a 16-byte boundary only when n is a multiple of V.
  if (m == 0 || n % V != 0 || !aligned16(grad_out.data_ptr()) || !aligned16(saved.data_ptr()) ||
      !aligned16(grad_pre.data_ptr()))
    return false;
  const int device = device_of(grad_pre, {&grad_out, &saved, &bias_grad}, "activation_backward_bias");
  cuda::DeviceGuard guard(device);
  KernelTimer timer("linear_activation_backward_bias", true);
  cudaStream_t stream = cuda::current_stream(device);
  // The chunk count fixes the bias gradient's summation order: enough chunks for about 4 x 256 threads an SM
  // over the row's groups of 32 V columns, each chunk at least 64 rows (8 per row lane).
  const int64_t col_groups = (n + 32 * V - 1) / (32 * V);
  const int64_t want = (4 * static_cast<int64_t>(sm_count(device)) + col_groups - 1) / col_groups;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({want, (m + 63) / 64, 65535}));
  const int64_t rows_per_chunk = (m + chunks - 1) / chunks;
  Tensor partial = Tensor::empty({chunks, n}, grad_pre.options().with_dtype(DType::Float32));
  const int64_t tiles = (n + kColLanes * V - 1) / (kColLanes * V);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), block(kColLanes, kRowLanes);
  const T* g = ptr<const T>(grad_out);
  const T* x = ptr<const T>(saved);
  if (act == LtActivation::Gelu) {
    activation_backward_bias_kernel<T, LtActivation::Gelu, V>
        <<<grid, block, 0, stream>>>(g, x, ptr<T>(grad_pre), ptr<float>(partial), m, n, rows_per_chunk);
  } else {
    activation_backward_bias_kernel<T, LtActivation::Relu, V>
        <<<grid, block, 0, stream>>>(g, x, ptr<T>(grad_pre), ptr<float>(partial), m, n, rows_per_chunk);
  }
  DPT_CUDA_CHECK_LAUNCH();
  column_partials_sum_kernel<T><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      ptr<const float>(partial), ptr<T>(bias_grad), chunks, n);
  DPT_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace dpt::cuda_kernels
