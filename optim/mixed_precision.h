#pragma once
// Mixed precision with float32 master weights (Micikevicius et al. 2018). The model's parameters are
// converted to the compute dtype (bfloat16 or float16) and used for forward and backward; float32
// masters hold the true weights and are what the optimizer updates, so its state is float32 too and
// small updates are not lost to 16-bit rounding. Per step:
//   1. forward in the compute dtype (matmuls accumulate in fp32; LayerNorm/softmax/loss stats in fp32),
//      backward of scale_loss(loss)
//   2. grads_to_master(): master.grad = float32(model.grad) / scale (model grads stay; zero them as
//      usual); false when a gradient is inf/NaN and the step must be skipped
//   3. clip and optimizer.step() on the masters (skipped on false)
//   4. masters_to_model(): model params = compute dtype(master) (skipped on false)
//   5. update_scale(skipped)
// bfloat16 has float32's exponent range, so it needs no loss scaling: scale_loss is the identity and
// grads_to_master never reports inf (no host sync). float16 (max 65504, min subnormal 2^-24) trains with
// dynamic loss scaling (optim/loss_scaler.h). With compute dtype float32 every call is a no-op pass
// through and masters alias the model's parameters: one switch selects the mode.
#include <memory>

#include "core/safetensors.h"
#include "core/tensor.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace dpt::optim {

class MixedPrecision {
 public:
  // Snapshots float32 masters of `model_params` (which must be float32 now) and converts the model's
  // parameters in place to `compute_dtype` (same handles; see nn::replace_data). `scaler` configures
  // loss scaling, which is used for float16 only.
  explicit MixedPrecision(const NamedTensors& model_params, DType compute_dtype = DType::BFloat16,
                          const LossScalerOptions& scaler = {});

  const NamedTensors& master_params() const { return masters_; }  // give these to the optimizer
  // The parameters whose gradients the optimizer reads: the model's bf16 ones once fused, else the masters.
  const NamedTensors& gradient_params() const { return fused_ ? model_ : masters_; }
  DType compute_dtype() const { return compute_dtype_; }
  bool enabled() const { return compute_dtype_ != DType::Float32; }

  // Loss scaling (float16 only): the scaler, or null; its current scale, 1 without one.
  LossScaler* loss_scaler() const { return scaler_.get(); }
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  // The tensor to call backward on: loss * scale under float16, `loss` itself otherwise.
  Tensor scale_loss(const Tensor& loss) const;

  // Gradients to the float32 masters (unscaled under float16). Returns false when, under float16, some
  // gradient is inf or NaN: then the caller skips clipping, the optimizer and masters_to_model. One
  // device flag read per call under float16, none otherwise.
  bool grads_to_master();
  // Ends the step for the scaler (no-op without one): backs off when the step was skipped for a
  // non-finite gradient, grows the scale after enough finite steps.
  void update_scale(bool found_inf);
  void masters_to_model();

  // bfloat16 only: `opt` (which must update master_params()) takes the model's bf16 parameters as its
  // compute twins (optim/optimizer.h): its fused update reads their gradients and writes them, so the
  // masters carry no gradients and grads_to_master / masters_to_model do nothing. Saves a float32
  // gradient copy, its zeroing and a conversion pass per step. Not for float16 (gradients need
  // unscaling and a finite check first); clipping then goes through the optimizer's grad scale
  // (Optimizer::set_grad_scale), the norm over gradient_params().
  void fuse_with(Optimizer& opt);
  bool fused() const { return fused_; }

 private:
  NamedTensors model_;
  NamedTensors masters_;
  DType compute_dtype_;
  std::unique_ptr<LossScaler> scaler_;
  bool fused_ = false;
};

}  // namespace dpt::optim
