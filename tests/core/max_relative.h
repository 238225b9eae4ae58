#pragma once
// max |a - b| / max(max |b|, floor) over all elements: the parity measure of the fused-op tests (a
// scale-aware error that does not blow up where b happens to be near zero). A raised floor keeps a
// reference that is exactly zero in exact arithmetic (attention's dQ and dK at T = 1) from turning
// rounding noise into an infinite error. Tensors of different sizes are infinitely far apart.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/tensor.h"

inline double max_relative(const dpt::Tensor& a, const dpt::Tensor& b, double floor = 1e-30) {
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  if (va.size() != vb.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = floor;
  for (size_t i = 0; i < va.size(); ++i) {
    num = std::max(num, std::abs(va[i] - vb[i]));
    den = std::max(den, std::abs(vb[i]));
  }
  return num / den;
}
