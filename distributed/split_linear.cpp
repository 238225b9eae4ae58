#include "distributed/split_linear.h"

#include <utility>

#include "core/autograd.h"
#include "core/linear_fused.h"

namespace dpt::dist {

// A fused forward whose activation backward a consumer may absorb: its saved state, its sink, and the
// autograd identity of its input and output.
struct SplitLinear::Absorbable {
  std::shared_ptr<const FusedLinear> saved;
  std::shared_ptr<LinearGradSink> sink;
  Tensor x;                  // the input as given (its edges are the consumer's when it absorbs)
  std::weak_ptr<Node> node;  // the output's grad_fn
};

SplitLinear::SplitLinear(Tensor weight, Tensor bias, std::shared_ptr<LinearGradSink> sink)
    : weight_(std::move(weight)), bias_(std::move(bias)), sink_(std::move(sink)) {}

// Without the fused path (CPU, float64, DPT_LINEAR_FUSED=0): matmul -> add -> act with W and b detached,
// and an identity op on x W^T + b whose backward hands its gradient to the sink. That op lists W among its
// inputs (its gradient: none) so that it is recorded even when x requires no gradient.
Tensor SplitLinear::forward_composed(const Tensor& x, Activation act) const {
  Tensor in = x.dim() == 1 ? x.reshape({1, x.size(0)}) : x;
  const int64_t k = weight_.size(1), n = weight_.size(0);
  sink_->on_input(in.detach().contiguous().reshape({in.numel() / k, k}));
  Tensor pre = matmul(in, weight_.detach(), false, true);
  if (bias_.defined()) pre = pre + bias_.detach();
  Tensor tapped = pre.detach();
  record_op("SplitLinearTap", {pre, weight_}, {tapped}, [sink = sink_, n](const std::vector<Tensor>& grads) {
    sink->on_output_grad(grads[0].contiguous().reshape({grads[0].numel() / n, n}));
    return std::vector<Tensor>{grads[0], Tensor()};
  });
  Tensor y = activate(tapped, act);
  return x.dim() == 1 ? y.reshape({n}) : y;
}

Tensor SplitLinear::forward(const Tensor& x, Activation act, const std::vector<const SplitLinear*>& producers) {
  last_.reset();
  const Tensor bias = bias_.defined() ? bias_.detach() : Tensor();
  Tensor out;
  std::shared_ptr<FusedLinear> saved = fused_linear_forward(x, weight_.detach(), bias, act, true, &out);
  if (!saved) return forward_composed(x, act);
  sink_->on_input(saved->x);

  std::shared_ptr<Absorbable> producer;
  if (const std::shared_ptr<Node> fn = x.requires_grad() ? x.grad_fn() : nullptr) {
    for (const SplitLinear* p : producers) {
      const std::shared_ptr<Absorbable> last = p->last_.lock();
      if (last && last->node.lock() == fn && last->saved->options.dtype == x.dtype() &&
          last->saved->options.device == x.device() && last->saved->n == saved->k && last->saved->m == saved->m)
        producer = last;
    }
  }

  const std::shared_ptr<LinearGradSink> sink = sink_;
  if (producer) {
    const bool need_x1 = producer->x.requires_grad();
    const Shape x1_shape = producer->x.shape();
    record_op("SplitLinearPairBackward", {producer->x, weight_}, {out},
              [saved, producer, sink, need_x1, x1_shape](const std::vector<Tensor>& grads) {
                const FusedLinear& s = *saved;
                const FusedLinear& p = *producer->saved;
                const Tensor gpre2 = fused_linear_pre_grad(s, fused_linear_rows(s, grads[0]));
                sink->on_output_grad(gpre2);
                const Tensor gpre1 = fused_linear_absorbed_pre_grad(p, gpre2, s.weight, false, nullptr);
                producer->sink->on_output_grad(gpre1);
                Tensor gx1;
                if (need_x1) gx1 = matmul(gpre1, p.weight).reshape(x1_shape);
                return std::vector<Tensor>{gx1, Tensor()};
              });
    return out;  // an op that absorbed its producer is not absorbable itself
  }

  const bool need_x = x.requires_grad();
  const Shape x_shape = x.shape();
  std::shared_ptr<Absorbable> self;
  if (fused_linear_absorbable(*saved)) self = std::make_shared<Absorbable>(Absorbable{saved, sink_, x, {}});
  // The node owns `self`: a consumer finds it through last_ for as long as this backward may still run.
  record_op("SplitLinearBackward", {x, weight_}, {out},
            [saved, sink, need_x, x_shape, self](const std::vector<Tensor>& grads) {
              const FusedLinear& s = *saved;
              const Tensor gpre = fused_linear_pre_grad(s, fused_linear_rows(s, grads[0]));
              sink->on_output_grad(gpre);
              Tensor gx;
              if (need_x) gx = matmul(gpre, s.weight).reshape(x_shape);
              return std::vector<Tensor>{gx, Tensor()};
            });
  if (self) {
    self->node = out.grad_fn();
    last_ = self;
  }
  return out;
}

}  // namespace dpt::dist
