#include "optim/loss_scaler.h"

#include <cmath>

#include "core/autograd.h"
#include "core/bfloat16.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/float16.h"
#include "core/ops.h"
#ifdef DPT_HAVE_CUDA
#include "core/cuda/stream.h"
#include "optim/cuda/loss_scale_kernels.h"
#endif

namespace dpt::optim {

namespace {

// The CPU pass of unscale_into: widen, multiply, note any non-finite result.
template <class T>
bool unscale_cpu(const T* src, float* dst, int64_t n, float inv_scale) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(src[i]) * inv_scale;
    dst[i] = v;
    bad |= !std::isfinite(v);
  }
  return bad;
}

}  // namespace

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options), scale_(options.init_scale) {
  DPT_CHECK(options.init_scale > 0 && std::isfinite(options.init_scale),
            "LossScaler: init_scale must be positive and finite, got {}", options.init_scale);
  DPT_CHECK(options.growth_factor > 1, "LossScaler: growth_factor must exceed 1, got {}", options.growth_factor);
  DPT_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1,
            "LossScaler: backoff_factor must lie in (0, 1), got {}", options.backoff_factor);
  DPT_CHECK(options.growth_interval > 0, "LossScaler: growth_interval must be positive, got {}",
            options.growth_interval);
}

Tensor LossScaler::scale_loss(const Tensor& loss) const {
  // In float32 (or float64): 2^16 times even a small loss would overflow a float16 loss tensor. The
  // gradient entering backward is then the scale itself, cast down once where the graph turns float16.
  const bool narrow = loss.dtype() == DType::Float16 || loss.dtype() == DType::BFloat16;
  return (narrow ? loss.to(DType::Float32) : loss) * scale_;
}

void LossScaler::unscale_into(const Tensor& grad, const Tensor& master_grad) {
  DPT_CHECK(grad.shape() == master_grad.shape() && grad.device() == master_grad.device(),
            "LossScaler: gradient {} on {} does not match master gradient {} on {}", shape_str(grad.shape()),
            grad.device().str(), shape_str(master_grad.shape()), master_grad.device().str());
  DPT_CHECK(master_grad.dtype() == DType::Float32 && master_grad.is_contiguous(),
            "LossScaler: master gradient must be contiguous float32, found {}", dtype_name(master_grad.dtype()));
  NoGradGuard no_grad;
  if (!found_inf_.defined() || found_inf_.device() != grad.device()) {
    found_inf_ = zeros({1}, TensorOptions{}.with_dtype(DType::Int32).with_device(grad.device()));
  }
  const Tensor g = grad.contiguous();
  const int64_t n = g.numel();
  // The reciprocal is exact for the power-of-two scales that the default factors produce.
  const float inv_scale = static_cast<float>(1.0 / scale_);
  if (g.device().is_cuda()) {
#ifdef DPT_HAVE_CUDA
    cuda::GradType type = cuda::GradType::Float32;
    if (g.dtype() == DType::Float16) {
      type = cuda::GradType::Float16;
    } else if (g.dtype() == DType::BFloat16) {
      type = cuda::GradType::BFloat16;
    } else {
      DPT_CHECK(g.dtype() == DType::Float32, "LossScaler: expected a float16, bfloat16 or float32 gradient, found {}",
                dtype_name(g.dtype()));
    }
    dpt::cuda::DeviceGuard guard(g.device().index);
    cuda::unscale_and_check(g.data_ptr(), type, master_grad.data<float>(), n, inv_scale, found_inf_.data<int32_t>());
#else
    DPT_FAIL("LossScaler: CUDA gradient in a build without CUDA");
#endif
    return;
  }
  bool bad = false;
  switch (g.dtype()) {
    case DType::Float16:
      bad = unscale_cpu(g.data<f16>(), master_grad.data<float>(), n, inv_scale);
      break;
    case DType::BFloat16:
      bad = unscale_cpu(g.data<bf16>(), master_grad.data<float>(), n, inv_scale);
      break;
    case DType::Float32:
      bad = unscale_cpu(g.data<float>(), master_grad.data<float>(), n, inv_scale);
      break;
    default:
      DPT_FAIL("LossScaler: expected a float16, bfloat16 or float32 gradient, found {}", dtype_name(g.dtype()));
  }
  if (bad) found_inf_.data<int32_t>()[0] = 1;
}

bool LossScaler::found_inf() {
  if (!found_inf_.defined()) return false;
  const bool found = found_inf_.item() != 0;  // the one host sync of the step
  if (found) found_inf_.zero_();
  return found;
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    // Growth stops short of overflowing the scale itself (float32, as the loss is scaled in float32).
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(static_cast<float>(grown))) scale_ = grown;
    growth_tracker_ = 0;
  }
}

void LossScaler::load(double scale, int64_t growth_tracker) {
  DPT_CHECK(scale > 0 && std::isfinite(scale), "LossScaler: saved scale must be positive and finite, got {}", scale);
  DPT_CHECK(growth_tracker >= 0, "LossScaler: saved growth count must not be negative, got {}", growth_tracker);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace dpt::optim
