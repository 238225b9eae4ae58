#include "optim/step_outcome.h"

#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#include "optim/grad_clip.h"
#ifdef DPT_HAVE_CUDA
#include "optim/cuda/fused_kernels.h"
#endif

namespace dpt::optim {

Tensor step_agreement(const Tensor& loss_sum, int64_t micro_batches, const double* stop) {
  DPT_CHECK(loss_sum.numel() == 1, "step_agreement: expected a one-element loss, got {}", shape_str(loss_sum.shape()));
  const Tensor loss = loss_sum.to(DType::Float32).contiguous();
  const Device device = loss.device();
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64).with_device(device);
  if (device.is_cuda()) {
    Tensor out = Tensor::empty({2}, f64);  // the kernel writes both entries
#ifdef DPT_HAVE_CUDA
    cuda::step_agreement(loss.data<float>(), micro_batches, stop, out.data<double>());
#endif
    return out;
  }
  return from_vector<double>({static_cast<double>(*loss.data<float>()) / static_cast<double>(micro_batches), *stop},
                             {2}, f64);
}

Tensor step_outcome(const Tensor& agreed, const Tensor& grad_sum_of_squares, double max_norm) {
  const Device device = grad_sum_of_squares.device();
  DPT_CHECK(agreed.numel() == 2 && agreed.dtype() == DType::Float64 && grad_sum_of_squares.numel() == 1 &&
                grad_sum_of_squares.dtype() == DType::Float64,
            "step_outcome: expected a float64 [2] agreement and a float64 [1] sum of squares, got {} {} and {} {}",
            dtype_name(agreed.dtype()), shape_str(agreed.shape()), dtype_name(grad_sum_of_squares.dtype()),
            shape_str(grad_sum_of_squares.shape()));
  const Tensor a = agreed.to(device).contiguous();
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64).with_device(device);
  if (device.is_cuda()) {
    Tensor out = Tensor::empty({kStepOutcomeSize}, f64);  // the kernel writes every entry
#ifdef DPT_HAVE_CUDA
    cuda::step_outcome(a.data<double>(), grad_sum_of_squares.data<double>(), max_norm, out.data<double>());
#endif
    return out;
  }
  const double loss = a.data<double>()[0];
  const double norm = std::sqrt(*grad_sum_of_squares.data<double>());
  const bool bad = !std::isfinite(loss) || !std::isfinite(norm);
  return from_vector<double>({loss, a.data<double>()[1], bad ? 1.0 : 0.0, clip_factor(norm, max_norm), norm},
                             {kStepOutcomeSize}, f64);
}

}  // namespace dpt::optim
