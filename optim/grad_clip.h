#pragma once
// Global gradient-norm clipping: treat all gradients as one vector g; if |g| > max_norm, scale every
// gradient by max_norm / (|g| + 1e-6). Returns |g| before clipping (what training logs report).
// Parameters without a gradient are skipped. A non-finite norm is returned without scaling, so the
// caller can see it and skip the step. grad_norm also counts bfloat16 gradients on CUDA (mixed
// precision's compute twins), which clip_grad_norm refuses: those are scaled as the optimizer reads them
// (Optimizer::set_grad_scale).
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"

namespace dpt::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The factor clipping scales by at this norm: max_norm / (norm + 1e-6) above max_norm, else 1 (also for a
// non-finite norm, which the caller skips).
double clip_factor(double norm, double max_norm);
double clip_grad_norm(const NamedTensors& params, double max_norm);
// The global norm alone (no clipping).
double grad_norm(const std::vector<Tensor>& params);
// The squared global norm of `params`' gradients as a float64 [1] tensor on `device` (where the gradients
// are), enqueued without waiting for it: what a step decided on the device reads (optim/step_outcome.h).
Tensor grad_sum_of_squares(const std::vector<Tensor>& params, Device device);
// The same of the elements of `tensors` themselves (float32 or bfloat16; on the CPU also float64): a rank's
// share of a norm spread over ranks (distributed/sharded_optimizer.h).
Tensor sum_of_squares(const std::vector<Tensor>& tensors, Device device);

}  // namespace dpt::optim
