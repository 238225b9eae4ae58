#pragma once
// max |a - b| / max |b| over all elements: the parity measure of the fused-op tests (a scale-aware
// error that does not blow up where b happens to be near zero).
#include <algorithm>
#include <cmath>

#include "core/tensor.h"

inline double max_relative(const dpt::Tensor& a, const dpt::Tensor& b) {
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num = std::max(num, std::abs(va[i] - vb[i]));
    den = std::max(den, std::abs(vb[i]));
  }
  return num / std::max(den, 1e-30);
}
