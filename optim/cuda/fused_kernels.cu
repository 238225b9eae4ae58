// Fused multi-tensor optimizer kernels (see fused_kernels.h for the launch scheme).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "optim/cuda/fused_kernels.h"

namespace dpt::optim::cuda {

namespace {

// Each block handles one chunk of one tensor. A launch carries up to kMaxTensors tensors and
// kMaxBlocks blocks in its argument struct (~10 KB, inside the 32 KB kernel-parameter limit of
// CUDA 12.1+ on Volta and later), so a group of any size needs ceil(chunks / kMaxBlocks) launches.
constexpr int kMaxLists = 5;
constexpr int kMaxTensors = 96;
constexpr int kMaxBlocks = 640;
constexpr int64_t kChunk = 65536;  // elements per block
constexpr int kThreads = 512;

struct MultiTensorArgs {
  void* ptrs[kMaxLists][kMaxTensors];
  int64_t sizes[kMaxTensors];
  int16_t block_tensor[kMaxBlocks];  // which tensor (index into ptrs) block b works on
  int32_t block_chunk[kMaxBlocks];   // which chunk of it
};

// Calls launch(args, num_blocks, first_block) for successive packs of (tensor, chunk) work items.
// `first_block` numbers blocks globally across launches (used to place per-block partial sums).
template <class Launch>
void multi_tensor_apply(int num_lists, const std::vector<std::vector<void*>>& lists, const std::vector<int64_t>& sizes,
                        Launch launch) {
  MultiTensorArgs args;
  int tensors = 0, blocks = 0, first_block = 0;
  auto flush = [&] {
    if (blocks > 0) launch(args, blocks, first_block);
    first_block += blocks;
    tensors = 0;
    blocks = 0;
  };
  for (size_t t = 0; t < sizes.size(); ++t) {
    if (sizes[t] == 0) continue;
    for (int l = 0; l < num_lists; ++l) args.ptrs[l][tensors] = lists[static_cast<size_t>(l)][t];
    args.sizes[tensors] = sizes[t];
    const int64_t chunks = (sizes[t] + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      args.block_tensor[blocks] = static_cast<int16_t>(tensors);
      args.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      if (blocks == kMaxBlocks) {
        // The tensor continues in the next pack: re-register it there at index 0.
        bool more = c + 1 < chunks;
        flush();
        if (more) {
          for (int l = 0; l < num_lists; ++l) args.ptrs[l][0] = lists[static_cast<size_t>(l)][t];
          args.sizes[0] = sizes[t];
          tensors = 0;
        } else {
          tensors = -1;  // incremented below to 0
        }
      }
    }
    ++tensors;
    if (tensors == kMaxTensors) flush();
  }
  flush();
}

int64_t count_blocks(const std::vector<int64_t>& sizes) {
  int64_t n = 0;
  for (int64_t s : sizes) n += (s + kChunk - 1) / kChunk;
  return n;
}

// G: the gradient's type (float, or __nv_bfloat16 read straight from a bf16 model's gradients).
// kTwin: also write the updated value, rounded to bf16, into list 4 (the model's compute copy), so
// mixed precision needs neither float32 gradient copies nor a separate float32 -> bf16 pass.
template <class G, bool kTwin>
__global__ void adam_kernel(MultiTensorArgs args, AdamParams hp) {
  const int t = args.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(args.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(begin + kChunk, args.sizes[t]);
  float* p = static_cast<float*>(args.ptrs[0][t]);
  const G* g = static_cast<const G*>(args.ptrs[1][t]);
  float* m = static_cast<float*>(args.ptrs[2][t]);
  float* v = static_cast<float*>(args.ptrs[3][t]);
  __nv_bfloat16* twin = kTwin ? static_cast<__nv_bfloat16*>(args.ptrs[4][t]) : nullptr;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float w = p[i], grad = static_cast<float>(g[i]);
    if (hp.decoupled) {
      w *= 1.f - hp.lr * hp.weight_decay;
    } else {
      grad += hp.weight_decay * w;
    }
    float mi = hp.beta1 * m[i] + (1.f - hp.beta1) * grad;
    float vi = hp.beta2 * v[i] + (1.f - hp.beta2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    w -= hp.lr * (mi / hp.bias_correction1) / (sqrtf(vi / hp.bias_correction2) + hp.eps);
    p[i] = w;
    if constexpr (kTwin) twin[i] = __float2bfloat16_rn(w);
  }
}

__global__ void sgd_kernel(MultiTensorArgs args, SgdParams hp, bool has_buffer) {
  const int t = args.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(args.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(begin + kChunk, args.sizes[t]);
  float* p = static_cast<float*>(args.ptrs[0][t]);
  const float* g = static_cast<const float*>(args.ptrs[1][t]);
  float* buf = static_cast<float*>(args.ptrs[2][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float grad = g[i] + hp.weight_decay * p[i];
    if (has_buffer) {
      float b = hp.momentum * buf[i] + grad;
      buf[i] = b;
      grad = hp.nesterov ? grad + hp.momentum * b : b;
    }
    p[i] -= hp.lr * grad;
  }
}

// Per-block sum of squares in float32 (tree within the block, fixed order), written to
// partials[first_block + blockIdx.x]; the partials are then summed in double by one block.
__global__ void sum_squares_kernel(MultiTensorArgs args, double* partials, int first_block) {
  __shared__ float shared[kThreads];
  const int t = args.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(args.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(begin + kChunk, args.sizes[t]);
  const float* x = static_cast<const float*>(args.ptrs[0][t]);
  float acc = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc += x[i] * x[i];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[first_block + blockIdx.x] = static_cast<double>(shared[0]);
}

__global__ void reduce_partials_kernel(const double* partials, int64_t n, double* out) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = shared[0];
}

__global__ void scale_kernel(MultiTensorArgs args, float factor) {
  const int t = args.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(args.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(begin + kChunk, args.sizes[t]);
  float* x = static_cast<float*>(args.ptrs[0][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] *= factor;
}

template <class T>
std::vector<void*> as_void(const std::vector<T*>& v) {
  std::vector<void*> out;
  out.reserve(v.size());
  for (T* p : v) out.push_back(const_cast<void*>(static_cast<const void*>(p)));
  return out;
}

void check_sizes(const char* what, size_t n, const std::vector<int64_t>& sizes) {
  DPT_CHECK(n == sizes.size(), "{}: {} pointers for {} sizes", what, n, sizes.size());
}

}  // namespace

void adam_update(const std::vector<float*>& params, const std::vector<const float*>& grads,
                 const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
                 const std::vector<int64_t>& sizes, const AdamParams& hp) {
  check_sizes("adam_update", params.size(), sizes);
  DPT_CHECK(grads.size() == sizes.size() && exp_avg.size() == sizes.size() && exp_avg_sq.size() == sizes.size(),
            "adam_update: lists of different lengths");
  cudaStream_t stream = dpt::cuda::current_stream();
  multi_tensor_apply(4, {as_void(params), as_void(grads), as_void(exp_avg), as_void(exp_avg_sq)}, sizes,
                     [&](const MultiTensorArgs& args, int blocks, int) {
                       adam_kernel<float, false><<<blocks, kThreads, 0, stream>>>(args, hp);
                       DPT_CUDA_CHECK(cudaGetLastError());
                     });
}

void adam_update_bf16_twins(const std::vector<float*>& params, const std::vector<const void*>& grads_bf16,
                            const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
                            const std::vector<void*>& twins_bf16, const std::vector<int64_t>& sizes,
                            const AdamParams& hp) {
  check_sizes("adam_update_bf16_twins", params.size(), sizes);
  DPT_CHECK(grads_bf16.size() == sizes.size() && exp_avg.size() == sizes.size() &&
                exp_avg_sq.size() == sizes.size() && twins_bf16.size() == sizes.size(),
            "adam_update_bf16_twins: lists of different lengths");
  cudaStream_t stream = dpt::cuda::current_stream();
  multi_tensor_apply(5, {as_void(params), as_void(grads_bf16), as_void(exp_avg), as_void(exp_avg_sq), twins_bf16},
                     sizes, [&](const MultiTensorArgs& args, int blocks, int) {
                       adam_kernel<__nv_bfloat16, true><<<blocks, kThreads, 0, stream>>>(args, hp);
                       DPT_CUDA_CHECK(cudaGetLastError());
                     });
}

void sgd_update(const std::vector<float*>& params, const std::vector<const float*>& grads,
                const std::vector<float*>& momentum_buffers, const std::vector<int64_t>& sizes, const SgdParams& hp) {
  check_sizes("sgd_update", params.size(), sizes);
  const bool has_buffer = !momentum_buffers.empty();
  DPT_CHECK(grads.size() == sizes.size() && (!has_buffer || momentum_buffers.size() == sizes.size()),
            "sgd_update: lists of different lengths");
  cudaStream_t stream = dpt::cuda::current_stream();
  std::vector<void*> buffers = has_buffer ? as_void(momentum_buffers) : std::vector<void*>(sizes.size(), nullptr);
  multi_tensor_apply(3, {as_void(params), as_void(grads), buffers}, sizes,
                     [&](const MultiTensorArgs& args, int blocks, int) {
                       sgd_kernel<<<blocks, kThreads, 0, stream>>>(args, hp, has_buffer);
                       DPT_CUDA_CHECK(cudaGetLastError());
                     });
}

double sum_of_squares(const std::vector<const float*>& tensors, const std::vector<int64_t>& sizes) {
  check_sizes("sum_of_squares", tensors.size(), sizes);
  const int64_t total_blocks = count_blocks(sizes);
  if (total_blocks == 0) return 0.0;
  cudaStream_t stream = dpt::cuda::current_stream();
  double* partials = nullptr;
  // Partials plus one slot for the result, stream-ordered so it is freed after the kernels finish.
  DPT_CUDA_CHECK(cudaMallocAsync(&partials, static_cast<size_t>(total_blocks + 1) * sizeof(double), stream));
  multi_tensor_apply(1, {as_void(tensors)}, sizes, [&](const MultiTensorArgs& args, int blocks, int first_block) {
    sum_squares_kernel<<<blocks, kThreads, 0, stream>>>(args, partials, first_block);
    DPT_CUDA_CHECK(cudaGetLastError());
  });
  reduce_partials_kernel<<<1, kThreads, 0, stream>>>(partials, total_blocks, partials + total_blocks);
  DPT_CUDA_CHECK(cudaGetLastError());
  double result = 0;
  DPT_CUDA_CHECK(cudaMemcpyAsync(&result, partials + total_blocks, sizeof(double), cudaMemcpyDeviceToHost, stream));
  DPT_CUDA_CHECK(cudaFreeAsync(partials, stream));
  DPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

void scale(const std::vector<float*>& tensors, const std::vector<int64_t>& sizes, float factor) {
  check_sizes("scale", tensors.size(), sizes);
  cudaStream_t stream = dpt::cuda::current_stream();
  multi_tensor_apply(1, {as_void(tensors)}, sizes, [&](const MultiTensorArgs& args, int blocks, int) {
    scale_kernel<<<blocks, kThreads, 0, stream>>>(args, factor);
    DPT_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace dpt::optim::cuda
