#pragma once
// Global gradient-norm clipping: treat all gradients as one vector g; if |g| > max_norm, scale every
// gradient by max_norm / (|g| + 1e-6). Returns |g| before clipping (what training logs report).
// Parameters without a gradient are skipped. A non-finite norm is returned without scaling, so the
// caller can see it and skip the step.
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"

namespace dpt::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
double clip_grad_norm(const NamedTensors& params, double max_norm);
// The global norm alone (no clipping).
double grad_norm(const std::vector<Tensor>& params);
// The sum of the squares of the elements of `tensors` themselves (float32; on the CPU also float64), in
// double precision: the local part of a norm spread over ranks (distributed/zero_optimizer.h).
double sum_of_squares(const std::vector<Tensor>& tensors);

}  // namespace dpt::optim
