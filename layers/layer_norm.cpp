#include "layers/layer_norm.h"

#include "core/error.h"
#include "core/ops.h"

namespace dpt::nn {

LayerNorm::LayerNorm(int64_t dim, double eps) : eps_(eps) {
  DPT_CHECK(dim > 0, "LayerNorm: dim must be positive, got {}", dim);
  weight = register_parameter("weight", ones({dim}));
  bias = register_parameter("bias", zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) {
  DPT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(0), "LayerNorm: expected input [..., {}], found {}",
            weight.size(0), shape_str(x.shape()));
  // Composed from ops (autograd for free); a fused kernel can replace this body later.
  const bool low_precision = x.dtype() == DType::BFloat16;
  Tensor h = low_precision ? x.to(DType::Float32) : x;
  Tensor w = low_precision ? weight.to(DType::Float32) : weight;
  Tensor b = low_precision ? bias.to(DType::Float32) : bias;
  Tensor centered = h - mean(h, -1, true);
  Tensor var = mean(centered * centered, -1, true);
  Tensor y = centered * pow(var + eps_, -0.5) * w + b;
  return low_precision ? y.to(DType::BFloat16) : y;
}

}  // namespace dpt::nn
