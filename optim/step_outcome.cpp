#include "optim/step_outcome.h"

#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#include "optim/grad_clip.h"
#ifdef DPT_HAVE_CUDA
#include "optim/cuda/fused_kernels.h"
#endif

namespace dpt::optim {

Tensor step_outcome(const Tensor& loss_sum, int64_t micro_batches, const Tensor& grad_sum_of_squares, double max_norm,
                    bool stop) {
  const Device device = grad_sum_of_squares.device();
  DPT_CHECK(loss_sum.numel() == 1 && grad_sum_of_squares.numel() == 1 && grad_sum_of_squares.dtype() == DType::Float64,
            "step_outcome: expected a one-element loss and a float64 [1] sum of squares, got {} and {} {}",
            shape_str(loss_sum.shape()), shape_str(grad_sum_of_squares.shape()),
            dtype_name(grad_sum_of_squares.dtype()));
  const Tensor loss = loss_sum.to(device).to(DType::Float32).contiguous();
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::Float64).with_device(device);
  if (device.is_cuda()) {
    Tensor out = Tensor::empty({kStepOutcomeSize}, f64);  // the kernel writes every entry
#ifdef DPT_HAVE_CUDA
    cuda::step_outcome(loss.data<float>(), micro_batches, grad_sum_of_squares.data<double>(), max_norm, stop ? 1 : 0,
                       out.data<double>());
#endif
    return out;
  }
  const double mean_loss = static_cast<double>(*loss.data<float>()) / static_cast<double>(micro_batches);
  const double norm = std::sqrt(*grad_sum_of_squares.data<double>());
  const bool bad = !std::isfinite(mean_loss) || !std::isfinite(norm);
  return from_vector<double>({mean_loss, stop ? 1.0 : 0.0, bad ? 1.0 : 0.0, clip_factor(norm, max_norm), norm},
                             {kStepOutcomeSize}, f64);
}

}  // namespace dpt::optim
