#pragma once
// Fused causal softmax for attention scores [..., T, T]: row i (query position i = row index mod T)
//   y[i, j] = exp(scale * s[i, j] - m_i) / sum_{k <= i} exp(scale * s[i, k] - m_i)   for j <= i,  0 for j > i
// with m_i the row maximum over j <= i. One read and one write of the scores instead of the three
// passes of scale, mask-add and softmax; statistics in float32 for bfloat16. Backward, for j <= i:
//   gs[i, j] = scale * y[i, j] * (gy[i, j] - sum_k gy[i, k] y[i, k]),  and 0 above the diagonal.
#include "core/tensor.h"

namespace dpt {

Tensor causal_softmax(const Tensor& scores, double scale);

}  // namespace dpt
