#include "layers/dropout.h"

#include "core/autograd.h"
#include "core/error.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace dpt::nn {

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  DPT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got {}", p);
  if (!training || p == 0) return x;
  Tensor mask;
  {
    NoGradGuard no_grad;
    // u in float32 whatever x's dtype, so the mask depends only on (seed, offset, index).
    Tensor u = Tensor::empty(x.shape(), x.options().with_dtype(DType::Float32));
    kernels::random_uniform(u, gen.seed(), gen.advance(static_cast<uint64_t>(u.numel())), 0.0, 1.0);
    Tensor shifted = add(u, -p);
    Tensor keep = Tensor::empty(x.shape(), u.options());
    kernels::unary(kernels::UnaryOp::ReluGrad, shifted, keep);  // 1 where u > p, else 0
    mask = mul(keep, 1.0 / (1.0 - p)).to(x.dtype());
  }
  return x * mask;
}

Dropout::Dropout(double p, Generator& gen) : p_(p), gen_(&gen) {
  DPT_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), *gen_); }

}  // namespace dpt::nn
