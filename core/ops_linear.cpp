// linear(x, W, b, act) = act(x W^T + b), with pre = x W^T + b and, for the M rows of x flattened:
//   dpre = dy * act'(pre)     dx = dpre W     dW = dpre^T x     db = sum over rows of dpre.
//
// CPU, float64, float16, DPT_LINEAR_FUSED=0, or operands cuBLASLt cannot take (row lengths that are
// not a multiple of 16 bytes, unaligned views): the composition matmul -> add -> gelu/relu, the very
// ops the layers used before, so those results are bit-identical to composing them.
//
// CUDA, float32 and bfloat16 (core/cuda/gemm_lt.h):
//   forward   one GEMM whose epilogue adds the bias and applies the activation, keeping for backward
//             the pre-activation (GELU) or a bit mask (ReLU) — no separate bias-add or activation pass.
//             Exception: GELU in float32 takes the bias epilogue and then core's GELU kernel, because
//             cuBLASLt evaluates the same tanh formula with its own float32 arithmetic, and float32 is
//             the precision the CPU parity tests hold at 1e-5; in bfloat16 the rounding of the result
//             dwarfs that difference and the GELU_AUX_BIAS epilogue is used;
//   backward  dpre in one elementwise pass (none for act = None), then dW through a GEMM and dx = dpre W.
//             db comes from the elementwise pass when there is one (bfloat16: it sums the columns as it
//             writes dpre), else from the consumer whose backward produced dy when it hands them over
//             (flash attention: core/grad_column_sums.h), else from core's column sums over
//             dpre (faster on Hopper than cuBLASLt's BGRADB epilogue, which runs as a separate kernel
//             anyway, see param_grads).
// A linear whose input is the direct output of a fused linear with ReLU (an MLP's Linear after
// Linear+ReLU) goes one step further, as llm.c and Transformer Engine do: its backward produces the
// *producer's* dpre directly from the GEMM that forms dh = dy W2, with the DRELU_BGRAD epilogue reading
// the producer's saved bit mask and emitting the producer's bias gradient as well. In autograd terms the
// consumer's node "absorbs" the producer: its edges go to the producer's inputs (x1, W1, b1) instead of
// to h, and its backward returns their gradients. If h has other uses, they still reach the producer's
// own node, which then adds their contribution — gradients are linear in the paths, so the sum is exact.
// Absorption is one level deep: an op that absorbed its producer is not itself absorbable (a chain
// L1 -> L2 -> L3 fuses L1 into L2).
// GELU is not absorbed: cuBLASLt runs bfloat16 DGELU_BGRAD on Hopper as a separate pass after the GEMM
// (0.35 ms a layer of GPT-2 on an H100), slower than the GEMM plus core's GELU backward.
//
// The CUDA pieces are public (core/linear_fused.h) for ops that form W's and b's gradients another way.
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/autograd.h"
#include "core/error.h"
#include "core/flags.h"
#include "core/grad_column_sums.h"
#include "core/kernels.h"
#include "core/linear_fused.h"
#include "core/op_helpers.h"
#include "core/ops.h"

#ifdef DPT_HAVE_CUDA
#include "core/cuda/gemm_lt.h"
#endif

namespace dpt {

namespace {

// Exactly what nn::Linear and the activation modules did before this op existed.
Tensor linear_composed(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  Tensor in = x.dim() == 1 ? x.reshape({1, x.size(0)}) : x;
  Tensor y = matmul(in, weight, false, true);
  if (bias.defined()) y = y + bias;
  y = activate(y, act);
  return x.dim() == 1 ? y.reshape({weight.size(0)}) : y;
}

#ifdef DPT_HAVE_CUDA
namespace ck = cuda_kernels;

// A fused linear with an activation that a following linear may absorb (see the top). Owned by the
// producer's backward closure (and by an absorbing consumer's); the registry maps the producer's
// autograd node to it so the consumer can find it from its input's grad_fn.
struct Absorbable;
std::mutex g_registry_mutex;
std::unordered_map<const Node*, std::weak_ptr<Absorbable>> g_registry;

struct Absorbable {
  std::shared_ptr<const FusedLinear> saved;
  Tensor x, weight, bias;  // the producer's inputs as given, with their autograd identity (edges)
  std::weak_ptr<Node> node;
  const Node* key = nullptr;
  ~Absorbable() {
    if (!key) return;
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    auto it = g_registry.find(key);
    if (it != g_registry.end() && it->second.expired()) g_registry.erase(it);
  }
};

std::shared_ptr<Absorbable> find_absorbable(const Tensor& h) {
  std::shared_ptr<Node> fn = h.grad_fn();
  if (!fn) return nullptr;
  std::weak_ptr<Absorbable> entry;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    auto it = g_registry.find(fn.get());
    if (it == g_registry.end()) return nullptr;
    entry = it->second;
  }
  // Locked outside the mutex: if this turns out to be the last owner, its destructor takes the mutex.
  std::shared_ptr<Absorbable> p = entry.lock();
  // The node must be the very one registered (a dead producer's address may have been reused).
  if (!p || p->node.lock() != fn) return nullptr;
  return p;
}

bool is_fusable_dtype(DType d) { return d == DType::Float32 || d == DType::BFloat16; }

Tensor rows_view(const Tensor& t, int64_t m, int64_t n) { return detail::contiguous_data(t).reshape({m, n}); }

// db = column sums of dpre, as sum(dpre, 0) forms them, into the bias's gradient buffer when it awaits its
// first write (core/autograd.h grad_out_for).
Tensor bias_grad(const FusedLinear& s, const Tensor& gpre) {
  Tensor gb = grad_out_for(s.bias_leaf, {s.n}, s.bias.options());
  kernels::reduce(kernels::ReduceOp::Sum, detail::contiguous_data(gpre.detach()), 1, s.m, s.n, gb, Tensor());
  return gb;
}

// dW = dpre^T x through cuBLASLt (a plain GEMM when it refuses), and db = column sums of dpre from core's
// reduction. cuBLASLt's BGRADB epilogue would fold db into the GEMM, but on Hopper it runs as a separate
// kernel after the GEMM that re-reads dpre, so it is no saving over the reduction. A first gradient since
// zero_grad() is written straight into W's gradient buffer (core/autograd.h first_grad_buffer), the same
// GEMM on the same operands: *gw then stays undefined.
void param_grads(const FusedLinear& s, const Tensor& gpre, bool need_w, bool need_b, Tensor* gw, Tensor* gb) {
  if (need_w) {
    ck::LtGemmArgs args;
    args.m = s.n;
    args.n = s.k;
    args.k = s.m;
    args.transpose_a = true;
    const Tensor into = first_grad_buffer(s.weight_leaf);
    if (into.defined() && ck::gemm_lt_supported(gpre, s.x, into, args) && ck::gemm_lt(gpre, s.x, into, args)) {
      mark_grad_written(s.weight_leaf);
    } else {
      Tensor w = Tensor::empty({s.n, s.k}, s.weight.options());
      const bool lt = ck::gemm_lt_supported(gpre, s.x, w, args) && ck::gemm_lt(gpre, s.x, w, args);
      *gw = lt ? w : matmul(gpre, s.x, true, false);
    }
  }
  if (need_b && s.bias.defined()) *gb = bias_grad(s, gpre);
}

// The fused op, or an undefined tensor when the fused forward cannot run (the caller composes instead). A
// defined `residual` (act None only) is added inside the GEMM: out = residual + x W^T + b.
Tensor linear_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                   const Tensor& residual = {}) {
  const bool backward =
      grad_mode_enabled() && (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  Tensor out;
  const std::shared_ptr<FusedLinear> saved = fused_linear_forward(x, weight, bias, act, backward, &out, residual);
  if (!saved) return {};
  if (!backward) return out;
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  if (need_w && !weight.grad_fn()) saved->weight_leaf = weight;
  if (need_b && !bias.grad_fn()) saved->bias_leaf = bias;
  const Shape x_shape = x.shape();
  std::shared_ptr<Absorbable> producer = need_x ? find_absorbable(x) : nullptr;
  if (producer && (producer->saved->options.dtype != x.dtype() || producer->saved->options.device != x.device() ||
                   producer->saved->n != saved->k || producer->saved->m != saved->m))
    producer = nullptr;

  // The residual's gradient is the output's, passed through as AddBackward does.
  const bool with_residual = residual.defined();
  auto inputs = [&](std::vector<Tensor> own) {
    if (with_residual) own.push_back(residual);
    return own;
  };
  auto outputs = [with_residual](std::vector<Tensor> own, const Tensor& grad_out) {
    if (with_residual) own.push_back(grad_out);
    return own;
  };

  if (producer) {
    const Tensor& x1 = producer->x;
    const Tensor& w1 = producer->weight;
    const Tensor& b1 = producer->bias;
    const bool need_x1 = x1.requires_grad(), need_w1 = w1.requires_grad();
    const bool need_b1 = b1.defined() && b1.requires_grad();
    record_op("LinearPairBackward", inputs({x1, w1, b1, weight, bias}), {out},
              [saved, producer, need_x1, need_w1, need_b1, need_w, need_b, outputs](const std::vector<Tensor>& grads) {
                const FusedLinear& s = *saved;
                const FusedLinear& p = *producer->saved;
                Tensor g = fused_linear_rows(s, grads[0]);
                Tensor gpre2 = fused_linear_pre_grad(s, g);
                Tensor gw2, gb2, gx1, gw1, gb1;
                param_grads(s, gpre2, need_w, need_b, &gw2, &gb2);
                gb2 = grad_formed(s.bias_leaf, gb2);  // before p's bias, which may be the same tensor
                if (need_x1 || need_w1 || need_b1) {
                  Tensor gpre1 = fused_linear_absorbed_pre_grad(p, gpre2, s.weight, need_b1, &gb1);
                  gb1 = grad_formed(p.bias_leaf, gb1);
                  param_grads(p, gpre1, need_w1, false, &gw1, nullptr);
                  if (need_x1) gx1 = matmul(gpre1, p.weight).reshape(producer->x.shape());
                }
                return outputs({gx1, gw1, gb1, gw2, gb2}, grads[0]);
              });
    return out;  // an op that absorbed its producer is not absorbable itself
  }

  std::shared_ptr<Absorbable> self;
  if (fused_linear_absorbable(*saved)) {
    self = std::make_shared<Absorbable>();
    self->saved = saved;
    self->x = x;
    self->weight = weight;
    self->bias = bias;
  }
  // Without an activation the bias gradient is the column sum of the output's gradient, which a
  // consumer (flash attention) may hand over (core/grad_column_sums.h).
  std::shared_ptr<GradColumnSums> sums_offer;
  if (act == Activation::None && need_b) sums_offer = std::make_shared<GradColumnSums>(saved->n, bias.dtype());
  record_op("LinearBackward", inputs({x, weight, bias}), {out},
            [saved, self, sums_offer, x_shape, need_x, need_w, need_b, outputs](const std::vector<Tensor>& grads) {
              const FusedLinear& s = *saved;
              Tensor gx, gw, gb;
              if (sums_offer) gb = sums_offer->take(grads[0]);
              Tensor g = fused_linear_rows(s, grads[0]);
              const bool bias_from_pass = need_b && !gb.defined() && s.bias.defined();
              Tensor gpre = fused_linear_pre_grad(s, g, bias_from_pass ? &gb : nullptr);
              param_grads(s, gpre, need_w, need_b && !gb.defined(), &gw, &gb);
              if (need_x) gx = matmul(gpre, s.weight).reshape(x_shape);
              return outputs({gx, gw, grad_formed(s.bias_leaf, gb)}, grads[0]);
            });
  if (sums_offer) offer_grad_column_sums(out, sums_offer);
  if (self) {
    if (std::shared_ptr<Node> node = out.grad_fn()) {
      self->node = node;
      self->key = node.get();
      std::lock_guard<std::mutex> lock(g_registry_mutex);
      g_registry[self->key] = self;
    }
  }
  return out;
}
#endif

}  // namespace

#ifdef DPT_HAVE_CUDA
std::shared_ptr<FusedLinear> fused_linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                  Activation act, bool backward, Tensor* out, const Tensor& residual) {
  const DType dt = x.dtype();
  if (!x.device().is_cuda() || !linear_fused()) return nullptr;
  if (!is_fusable_dtype(dt) || weight.dtype() != dt || weight.device() != x.device() || !weight.is_contiguous())
    return nullptr;
  if (bias.defined() && (bias.dtype() != dt || bias.device() != x.device() || !bias.is_contiguous())) return nullptr;
  const int64_t k = weight.size(1), n = weight.size(0);
  const int64_t m = x.numel() / k;
  if (m == 0) return nullptr;
  if (residual.defined() && (act != Activation::None || residual.dtype() != dt || residual.device() != x.device() ||
                             !residual.is_contiguous() || residual.numel() != m * n))
    return nullptr;

  auto saved = std::make_shared<FusedLinear>();
  saved->x = rows_view(x.detach(), m, k);
  saved->weight = weight.detach();
  if (bias.defined()) saved->bias = bias.detach();
  saved->act = act;
  saved->m = m;
  saved->n = n;
  saved->k = k;
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(n);
  *out = detail::empty_as(x, out_shape);
  saved->options = out->options();
  const Tensor out2d = out->detach().reshape({m, n});
  if (act == Activation::Relu) saved->out = out2d;

  ck::LtGemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.transpose_b = true;
  args.bias = saved->bias;
  // float32 GELU: the GEMM writes pre (+ bias) into the aux buffer and core's GELU kernel follows (see
  // the top: float32 keeps core's GELU arithmetic). Without a backward to come (inference, frozen
  // layers) the epilogue keeps no aux.
  const bool gelu_after = act == Activation::Gelu && dt == DType::Float32;
  saved->gelu_after = gelu_after;
  if (act == Activation::Gelu) {
    if (gelu_after || backward) saved->aux = Tensor::empty({m, n}, out->options());
    args.epilogue = gelu_after ? (bias.defined() ? ck::LtEpilogue::Bias : ck::LtEpilogue::None)
                    : backward ? ck::LtEpilogue::GeluAux
                               : ck::LtEpilogue::Gelu;
  } else if (act == Activation::Relu) {
    args.epilogue = backward ? ck::LtEpilogue::ReluAux : ck::LtEpilogue::Relu;
    if (backward) saved->aux = Tensor::empty({ck::relu_mask_words(m, n)}, out->options().with_dtype(DType::Int32));
  } else {
    args.epilogue = bias.defined() ? ck::LtEpilogue::Bias : ck::LtEpilogue::None;
    if (residual.defined()) args.addend = residual.detach().reshape({m, n});
  }
  if (gelu_after) {
    if (!ck::gemm_lt_supported(saved->x, saved->weight, saved->aux, args)) return nullptr;
    if (!ck::gemm_lt(saved->x, saved->weight, saved->aux, args)) return nullptr;
    kernels::unary(kernels::UnaryOp::Gelu, saved->aux, out2d);
  } else {
    args.aux = saved->aux;
    if (!ck::gemm_lt_supported(saved->x, saved->weight, out2d, args)) return nullptr;
    if (!ck::gemm_lt(saved->x, saved->weight, out2d, args)) return nullptr;
  }
  return saved;
}

Tensor fused_linear_rows(const FusedLinear& s, const Tensor& grad_out) {
  return rows_view(grad_out.to(s.options.dtype), s.m, s.n);
}

Tensor fused_linear_pre_grad(const FusedLinear& s, const Tensor& grad_out, Tensor* gb) {
  if (s.act == Activation::None) return grad_out;
  Tensor g = Tensor::empty({s.m, s.n}, s.options);
  const bool gelu = s.act == Activation::Gelu;
  const Tensor& saved = gelu ? s.aux : s.out;
  const ck::LtActivation act = gelu ? ck::LtActivation::Gelu : ck::LtActivation::Relu;
  if (gb) {
    Tensor b = grad_out_for(s.bias_leaf, {s.n}, s.bias.options());
    if (ck::activation_backward_bias(grad_out, saved, g, b, act)) {
      *gb = b;
      return g;
    }
  }
  ck::activation_backward(grad_out, saved, g, act);
  return g;
}

bool fused_linear_absorbable(const FusedLinear& producer) {
  return producer.act == Activation::Relu && linear_absorb();
}

Tensor fused_linear_absorbed_pre_grad(const FusedLinear& p, const Tensor& grad_pre2, const Tensor& w2, bool need_b,
                                      Tensor* gb) {
  need_b = need_b && p.bias.defined();
  Tensor gpre = Tensor::empty({p.m, p.n}, p.options);
  ck::LtGemmArgs args;
  args.m = p.m;
  args.n = p.n;
  args.k = w2.size(0);
  args.epilogue = ck::LtEpilogue::DRelu;
  args.aux = p.aux;
  if (need_b) {
    // Into the bias's gradient buffer only at the alignment a new tensor has, which the algorithm choice
    // (and so the rounding) depends on.
    args.bias = grad_out_for(p.bias_leaf, {p.n}, p.bias.options());
    if (reinterpret_cast<uintptr_t>(args.bias.data_ptr()) % 256 != 0)
      args.bias = Tensor::empty({p.n}, p.bias.options());
  }
  if (ck::gemm_lt_supported(grad_pre2, w2, gpre, args) && ck::gemm_lt(grad_pre2, w2, gpre, args)) {
    if (need_b) *gb = args.bias;
    return gpre;
  }
  gpre = fused_linear_pre_grad(p, matmul(grad_pre2, w2));
  if (need_b) *gb = bias_grad(p, gpre);
  return gpre;
}

#else
std::shared_ptr<FusedLinear> fused_linear_forward(const Tensor&, const Tensor&, const Tensor&, Activation, bool,
                                                  Tensor*, const Tensor&) {
  return nullptr;
}
Tensor fused_linear_rows(const FusedLinear&, const Tensor&) { DPT_FAIL("fused_linear_rows: built without CUDA"); }
Tensor fused_linear_pre_grad(const FusedLinear&, const Tensor&, Tensor*) {
  DPT_FAIL("fused_linear_pre_grad: built without CUDA");
}
bool fused_linear_absorbable(const FusedLinear&) { return false; }
Tensor fused_linear_absorbed_pre_grad(const FusedLinear&, const Tensor&, const Tensor&, bool, Tensor*) {
  DPT_FAIL("fused_linear_absorbed_pre_grad: built without CUDA");
}
#endif

Tensor activate(const Tensor& x, Activation act) {
  switch (act) {
    case Activation::None:
      return x;
    case Activation::Gelu:
      return gelu(x);
    case Activation::Relu:
      return relu(x);
  }
  DPT_FAIL("activate: unknown activation {}", static_cast<int>(act));
}

void set_linear_fused(bool enabled) { set_flag(Flag::LinearFused, enabled ? "1" : "0"); }

void set_linear_absorb(bool enabled) { set_flag(Flag::LinearAbsorb, enabled ? "1" : "0"); }

bool linear_absorb() { return flag_on(Flag::LinearAbsorb); }

bool linear_fused() { return flag_on(Flag::LinearFused); }

namespace {
void check_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  DPT_CHECK(x.defined() && weight.defined(), "linear: undefined input or weight");
  DPT_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
            "linear: expected input [..., {}] for weight {}, found {}", weight.dim() == 2 ? weight.size(1) : -1,
            shape_str(weight.shape()), shape_str(x.shape()));
  DPT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
            "linear: expected bias [{}] for weight {}, found {}", weight.size(0), shape_str(weight.shape()),
            shape_str(bias.shape()));
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  check_linear(x, weight, bias);
#ifdef DPT_HAVE_CUDA
  if (Tensor y = linear_cuda(x, weight, bias, act); y.defined()) return y;
#endif
  return linear_composed(x, weight, bias, act);
}

Tensor linear_residual(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual) {
  check_linear(x, weight, bias);
  DPT_CHECK(residual.defined(), "linear_residual: undefined residual");
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(weight.size(0));
  DPT_CHECK(residual.shape() == out_shape,
            "linear_residual: expected a residual of shape {} for input {} and weight {}, found {}",
            shape_str(out_shape), shape_str(x.shape()), shape_str(weight.shape()), shape_str(residual.shape()));
#ifdef DPT_HAVE_CUDA
  if (Tensor y = linear_cuda(x, weight, bias, Activation::None, residual); y.defined()) return y;
#endif
  return add(residual, linear(x, weight, bias));
}

}  // namespace dpt
