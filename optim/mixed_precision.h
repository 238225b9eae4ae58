#pragma once
// Mixed precision with float32 master weights (Micikevicius et al. 2018, with bf16 instead of fp16).
// The model's parameters are converted to the compute dtype (bfloat16) and used for forward and
// backward; float32 masters hold the true weights and are what the optimizer updates, so its state is
// float32 too and small updates are not lost to bf16 rounding. Per step:
//   1. forward/backward in bf16 (matmuls accumulate in fp32; LayerNorm/softmax/loss stats in fp32)
//   2. grads_to_master(): master.grad = float32(model.grad) (model grads stay; zero them as usual)
//   3. clip and optimizer.step() on the masters
//   4. masters_to_model(): model params = bf16(master)
// bf16 has float32's exponent range, so no loss scaling is needed. (fp16 with dynamic loss scaling is
// not offered: dptrain has no float16 tensors.) With compute dtype float32 every call is a no-op pass
// through and masters alias the model's parameters: one switch selects the mode.
#include "core/safetensors.h"
#include "core/tensor.h"

namespace dpt::optim {

class MixedPrecision {
 public:
  // Snapshots float32 masters of `model_params` (which must be float32 now) and converts the model's
  // parameters in place to `compute_dtype` (same handles; see nn::replace_data).
  explicit MixedPrecision(const NamedTensors& model_params, DType compute_dtype = DType::BFloat16);

  const NamedTensors& master_params() const { return masters_; }  // give these to the optimizer
  DType compute_dtype() const { return compute_dtype_; }
  bool enabled() const { return compute_dtype_ != DType::Float32; }

  void grads_to_master();
  void masters_to_model();

 private:
  NamedTensors model_;
  NamedTensors masters_;
  DType compute_dtype_;
};

}  // namespace dpt::optim
