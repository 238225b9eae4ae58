#pragma once
// Fused LayerNorm over the last dimension:
//   mean = sum(x) / n,  rstd = 1 / sqrt(sum((x - mean)^2) / n + eps),  y = (x - mean) * rstd * w + b
// One pass computes y and keeps only the per-row (mean, rstd) for backward, in float32 (float64 for
// float64 input), whatever the input dtype. Backward, with xhat = (x - mean) * rstd and g = gy * w:
//   gx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  gw = sum_rows(gy * xhat),  gb = sum_rows(gy)
// The column sums are deterministic: fixed chunks of rows, then a fixed-order sum of the chunks.
#include "core/tensor.h"

namespace dpt {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// A pre-LN residual block reads x twice: normalized, into the branch, and as is, into the skip connection
// (h = x + f(layer_norm(x))). This op returns both: `normed` = layer_norm(x) and `skip`, the same values
// as x under a handle of its own. Backward then gets both gradients at once and adds the skip's inside
// the LayerNorm backward kernel, before its one rounding, where the usual graph would run a separate add
// of the two gradients of x.
struct NormAndSkip {
  Tensor normed, skip;
};
NormAndSkip layer_norm_and_skip(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace dpt
