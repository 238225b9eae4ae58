#include "optim/grad_clip.h"

#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#ifdef DPT_HAVE_CUDA
#include "optim/cuda/fused_kernels.h"
#endif

namespace dpt::optim {

namespace {

struct GradLists {
  std::vector<Tensor> cpu;
  std::vector<float*> cuda;
  std::vector<int64_t> cuda_sizes;
  std::vector<const void*> cuda_bf16;  // bf16 gradients of mixed precision's compute twins: counted, never scaled
  std::vector<int64_t> cuda_bf16_sizes;
};

// The tensors to sum: `tensors` themselves, or with `grads_of` their gradients (skipping those without).
GradLists gather(const std::vector<Tensor>& tensors, bool grads_of = true) {
  GradLists lists;
  for (const Tensor& t : tensors) {
    Tensor g = grads_of ? t.grad() : t;
    if (!g.defined()) continue;
    if (g.device().is_cuda() && g.dtype() == DType::BFloat16) {
      lists.cuda_bf16.push_back(g.data_ptr());
      lists.cuda_bf16_sizes.push_back(g.numel());
    } else if (g.device().is_cuda()) {
      DPT_CHECK(g.dtype() == DType::Float32, "clip_grad_norm: CUDA gradients must be float32 or bfloat16, found {}",
                dtype_name(g.dtype()));
      lists.cuda.push_back(g.data<float>());
      lists.cuda_sizes.push_back(g.numel());
    } else {
      DPT_CHECK(g.dtype() == DType::Float32 || g.dtype() == DType::Float64,
                "clip_grad_norm: CPU gradients must be float32 or float64, found {}", dtype_name(g.dtype()));
      lists.cpu.push_back(g);
    }
  }
  return lists;
}

double sum_squares(const GradLists& lists) {
  double total = 0;
  for (const Tensor& g : lists.cpu) {
    if (g.dtype() == DType::Float32) {
      const float* x = g.data<float>();
      for (int64_t i = 0; i < g.numel(); ++i) total += static_cast<double>(x[i]) * x[i];
    } else {
      const double* x = g.data<double>();
      for (int64_t i = 0; i < g.numel(); ++i) total += x[i] * x[i];
    }
  }
  if (!lists.cuda.empty()) {
#ifdef DPT_HAVE_CUDA
    std::vector<const float*> ptrs(lists.cuda.begin(), lists.cuda.end());
    total += cuda::sum_of_squares(ptrs, lists.cuda_sizes);
#endif
  }
  if (!lists.cuda_bf16.empty()) {
#ifdef DPT_HAVE_CUDA
    total += cuda::sum_of_squares_bf16(lists.cuda_bf16, lists.cuda_bf16_sizes);
#endif
  }
  return total;
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) { return std::sqrt(sum_squares(gather(params))); }

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  DPT_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got {}", max_norm);
  GradLists lists = gather(params);
  DPT_CHECK(lists.cuda_bf16.empty(),
            "clip_grad_norm: bfloat16 gradients are not scaled in place; take grad_norm "
            "and give the optimizer the factor (Optimizer::set_grad_scale)");
  double norm = std::sqrt(sum_squares(lists));
  const double factor = clip_factor(norm, max_norm);
  if (factor == 1.0) return norm;
  for (const Tensor& g : lists.cpu) {
    if (g.dtype() == DType::Float32) {
      float* x = g.data<float>();
      for (int64_t i = 0; i < g.numel(); ++i) x[i] = static_cast<float>(x[i] * factor);
    } else {
      double* x = g.data<double>();
      for (int64_t i = 0; i < g.numel(); ++i) x[i] *= factor;
    }
  }
  if (!lists.cuda.empty()) {
#ifdef DPT_HAVE_CUDA
    cuda::scale(lists.cuda, lists.cuda_sizes, static_cast<float>(factor));
#endif
  }
  return norm;
}

namespace {

Tensor sum_of_squares_on(const GradLists& lists, Device device) {
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64).with_device(device);
  if (!device.is_cuda()) return from_vector<double>({sum_squares(lists)}, {1}, f64);
  DPT_CHECK(lists.cpu.empty(), "sum of squares: tensors on the CPU and on {} together", device.str());
  Tensor out = Tensor::empty({1}, f64);  // sum_of_squares_into writes it, whatever the gradients
#ifdef DPT_HAVE_CUDA
  std::vector<const float*> f32(lists.cuda.begin(), lists.cuda.end());
  cuda::sum_of_squares_into(f32, lists.cuda_sizes, lists.cuda_bf16, lists.cuda_bf16_sizes, out.data<double>());
#endif
  return out;
}

}  // namespace

Tensor grad_sum_of_squares(const std::vector<Tensor>& params, Device device) {
  return sum_of_squares_on(gather(params), device);
}

Tensor sum_of_squares(const std::vector<Tensor>& tensors, Device device) {
  // On the CPU bf16 (a sharded bf16 run there) is read through float32 copies, which are exact.
  std::vector<Tensor> readable;
  for (const Tensor& t : tensors)
    readable.push_back(!t.device().is_cuda() && t.dtype() == DType::BFloat16 ? t.to(DType::Float32) : t);
  return sum_of_squares_on(gather(readable, false), device);
}

double clip_factor(double norm, double max_norm) {
  return std::isfinite(norm) && max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

double clip_grad_norm(const NamedTensors& params, double max_norm) {
  std::vector<Tensor> ps;
  for (const auto& [name, p] : params) ps.push_back(p);
  return clip_grad_norm(ps, max_norm);
}

}  // namespace dpt::optim
