#include "layers/rms_norm.h"

#include "core/error.h"
#include "core/ops.h"

namespace dpt::nn {

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  DPT_CHECK(x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0),
            "rms_norm: expected input [..., {}] for weight [{}], found {}", weight.size(0), weight.size(0),
            shape_str(x.shape()));
  // 16-bit input: statistics in float32 (in fp16, x^2 would overflow above 256).
  const bool low = x.dtype() == DType::BFloat16 || x.dtype() == DType::Float16;
  const Tensor xf = low ? x.to(DType::Float32) : x;
  // rms = sqrt(mean(x^2) + eps) over the last dimension, kept as [..., 1] so it broadcasts over D.
  const Tensor rms = sqrt(mean(pow(xf, 2.0), xf.dim() - 1, /*keepdim=*/true) + eps);
  const Tensor y = div(xf, rms);
  return mul(low ? y.to(x.dtype()) : y, weight);
}

RMSNorm::RMSNorm(int64_t dim, double eps) : eps_(eps) {
  DPT_CHECK(dim > 0, "RMSNorm: dim must be positive, got {}", dim);
  weight = register_parameter("weight", ones({dim}));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, weight, eps_); }

}  // namespace dpt::nn
