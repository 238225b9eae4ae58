#include "optim/mixed_precision.h"

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"

namespace dpt::optim {

namespace {
// Same handle, new data: everything holding the parameter (layers, DDP) sees the converted tensor.
void replace_data(const Tensor& param, const Tensor& value) {
  TensorImpl* dst = param.impl();
  const TensorImpl* src = value.impl();
  dst->storage = src->storage;
  dst->offset = src->offset;
  dst->shape = src->shape;
  dst->strides = src->strides;
  dst->dtype = src->dtype;
  dst->device = src->device;
  param.set_grad(Tensor());
}
}  // namespace

MixedPrecision::MixedPrecision(const NamedTensors& model_params, DType compute_dtype, const LossScalerOptions& scaler)
    : model_(model_params), compute_dtype_(compute_dtype) {
  DPT_CHECK(compute_dtype == DType::Float32 || compute_dtype == DType::BFloat16 || compute_dtype == DType::Float16,
            "MixedPrecision: compute dtype must be float32, bfloat16 or float16, got {}", dtype_name(compute_dtype));
  if (compute_dtype == DType::Float16) scaler_ = std::make_unique<LossScaler>(scaler);
  if (!enabled()) {
    masters_ = model_params;
    return;
  }
  NoGradGuard no_grad;
  for (const auto& [name, p] : model_) {
    DPT_CHECK(p.dtype() == DType::Float32, "MixedPrecision: parameter '{}' is {}, expected float32 before conversion",
              name, dtype_name(p.dtype()));
    Tensor master = p.detach().clone();
    master.requires_grad_(true);
    masters_.emplace_back(name, master);
    replace_data(p, p.detach().to(compute_dtype));
  }
}

Tensor MixedPrecision::scale_loss(const Tensor& loss) const { return scaler_ ? scaler_->scale_loss(loss) : loss; }

bool MixedPrecision::grads_to_master() {
  if (!enabled() || fused_) return true;
  NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i) {
    const Tensor& p = model_[i].second;
    const Tensor& master = masters_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) {
      master.set_grad(Tensor());
      continue;
    }
    Tensor mg = master.grad();
    if (!mg.defined()) {
      mg = zeros(master.shape(), master.options());
      master.set_grad(mg);
    }
    if (scaler_) {
      scaler_->unscale_into(g, mg);  // float16 -> float32 / scale, inf/NaN noted on the device
    } else {
      mg.copy_(g);  // bf16 -> float32, exact
    }
  }
  return scaler_ ? !scaler_->found_inf() : true;
}

void MixedPrecision::update_scale(bool found_inf) {
  if (scaler_) scaler_->update(found_inf);
}

void MixedPrecision::masters_to_model() {
  if (!enabled() || fused_) return;
  NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i) {
    Tensor p = model_[i].second;
    p.copy_(masters_[i].second);  // float32 -> bf16/fp16, round to nearest even
  }
}

}  // namespace dpt::optim

namespace dpt::optim {

void MixedPrecision::fuse_with(Optimizer& opt) {
  DPT_CHECK(compute_dtype_ == DType::BFloat16, "MixedPrecision::fuse_with: only for bfloat16 compute, not {}",
            dtype_name(compute_dtype_));
  opt.set_compute_twins(model_);
  for (const auto& [name, master] : masters_) master.set_grad(Tensor());
  fused_ = true;
}

}  // namespace dpt::optim
