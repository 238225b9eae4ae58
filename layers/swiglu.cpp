#include "layers/swiglu.h"

#include "core/ops.h"
#include "layers/dropout.h"

namespace dpt::nn {

int64_t SwiGLU::hidden_width(int64_t n_embd) { return (8 * n_embd / 3 + 7) / 8 * 8; }

int64_t SwiGLU::parameter_count(int64_t n_embd, bool bias) {
  const int64_t h = hidden_width(n_embd);
  return 3 * n_embd * h + (bias ? 2 * h + n_embd : 0);  // gate and up C x H (+ H each), proj H x C (+ C)
}

SwiGLU::SwiGLU(int64_t n_embd, double dropout, Generator& gen, bool bias) : dropout_(dropout), gen_(&gen) {
  const int64_t h = hidden_width(n_embd);
  gate = register_module("gate", std::make_shared<Linear>(n_embd, h, bias, gen));
  up = register_module("up", std::make_shared<Linear>(n_embd, h, bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(h, n_embd, bias, gen));
}

Tensor SwiGLU::hidden(const Tensor& x) {
  Tensor g = gate->forward(x);
  return mul(mul(g, sigmoid(g)), up->forward(x));
}

Tensor SwiGLU::forward(const Tensor& x) { return dropout(proj->forward(hidden(x)), dropout_, is_training(), *gen_); }

Tensor SwiGLU::forward_residual(const Tensor& x, const Tensor& residual) {
  if (is_training() && dropout_ > 0) return dpt::dropout_add(proj->forward(hidden(x)), residual, dropout_, *gen_);
  return proj->forward_residual(hidden(x), residual);
}

}  // namespace dpt::nn
