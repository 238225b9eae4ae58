#include "core/autograd.h"

#include <atomic>
#include <map>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace dpt {

namespace {

thread_local bool g_grad_enabled = true;
std::atomic<uint64_t> g_next_sequence_nr{0};

// A node built from a lambda: what record_op attaches to an op's outputs.
class FunctionNode : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  // Runs once: the closure, and with it every tensor the op saved for backward, is released when this
  // call returns, as PyTorch does without retain_graph. So activations leave memory layer by layer as
  // backward walks down the model, and a graph the caller still holds (the returned loss) pins no
  // activations into the next step.
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override {
    DPT_CHECK(fn_ != nullptr,
              "{}: a second backward through the graph; the first released what this op saved for it "
              "(run the forward pass again)",
              name_);
    BackwardFn fn = std::move(fn_);
    fn_ = nullptr;
    return fn(grad_outputs);
  }
  std::string name() const override { return name_; }

 private:
  const char* name_;
  BackwardFn fn_;
};

// The sink of a leaf's gradient. It holds the leaf's impl (not a Tensor handle: the leaf owns no
// pointer back to it except a weak one, so there is no cycle).
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {
    num_outputs = 1;
    leaf_sink = true;
  }

  // Runs once every use of the leaf is done, also when autograd delivers nothing (an op may have written
  // the gradient in place: mark_grad_written).
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override {
    Tensor leaf(leaf_);
    const Tensor& g = grad_outputs[0];
    AutogradMeta& meta = leaf_->autograd_meta();
    const bool written = meta.grad_written;
    meta.grad_written = false;
    if (g.defined()) {
      Tensor incoming = g.dtype() == leaf.dtype() ? g : g.to(leaf.dtype());
      if (meta.grad && meta.grad->defined() && meta.grad_zero_pending) {
        // First gradient since zero_grad(): overwrite, in place (it may be a bucket view).
        meta.grad->copy_(incoming);
        meta.grad_zero_pending = false;
      } else if (meta.grad && meta.grad->defined()) {
        // Accumulate in place: the gradient may be a view into a communication bucket.
        kernels::binary(kernels::BinaryOp::Add, *meta.grad, incoming.contiguous(), *meta.grad);
      } else {
        meta.grad = std::make_shared<Tensor>(incoming.contiguous().clone());
      }
    } else if (!written) {
      return {};
    }
    for (auto& hook : meta.grad_ready_hooks) hook(leaf);
    return {};
  }
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& meta = leaf.impl()->autograd_meta();
  auto node = meta.grad_accumulator.lock();
  if (!node) {
    node = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    meta.grad_accumulator = node;
  }
  return node;
}

Edge edge_for(const Tensor& input) {
  if (!input.defined() || !input.requires_grad()) return {};
  if (auto fn = input.grad_fn()) return {fn, input.impl()->autograd->output_nr};
  return {grad_accumulator(input), 0};
}

std::mutex g_callbacks_mutex;
std::map<uint64_t, std::function<void()>> g_backward_end_callbacks;
uint64_t g_next_callback_id = 0;

void run_backward_end_callbacks() {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(g_callbacks_mutex);
    for (auto& [id, cb] : g_backward_end_callbacks) callbacks.push_back(cb);
  }
  for (auto& cb : callbacks) cb();
}

}  // namespace

uint64_t add_backward_end_callback(std::function<void()> callback) {
  std::lock_guard<std::mutex> lock(g_callbacks_mutex);
  g_backward_end_callbacks[g_next_callback_id] = std::move(callback);
  return g_next_callback_id++;
}

void remove_backward_end_callback(uint64_t id) {
  std::lock_guard<std::mutex> lock(g_callbacks_mutex);
  g_backward_end_callbacks.erase(id);
}

Node::Node() : sequence_nr(g_next_sequence_nr++) {}

Tensor first_grad_buffer(const Tensor& leaf) {
  if (!leaf.defined() || !leaf.requires_grad() || leaf.grad_fn()) return Tensor();
  const AutogradMeta& meta = leaf.impl()->autograd_meta();
  if (!meta.grad_zero_pending || !meta.grad || !meta.grad->defined() || !meta.grad->is_contiguous()) return Tensor();
  return *meta.grad;
}

void mark_grad_written(const Tensor& leaf) {
  AutogradMeta& meta = leaf.impl()->autograd_meta();
  DPT_CHECK(meta.grad_zero_pending && !leaf.grad_fn(),
            "mark_grad_written: the leaf's gradient was not awaiting its first write (first_grad_buffer)");
  meta.grad_zero_pending = false;
  meta.grad_written = true;
}

Tensor grad_out_for(const Tensor& leaf, const Shape& shape, const TensorOptions& options) {
  Tensor into = first_grad_buffer(leaf);
  if (into.defined() && into.shape() == shape && into.dtype() == options.dtype && into.device() == options.device)
    return into;
  return Tensor::empty(shape, options);
}

Tensor grad_formed(const Tensor& leaf, const Tensor& grad) {
  const Tensor into = first_grad_buffer(leaf);
  if (!grad.defined() || !into.defined() || grad.impl() != into.impl()) return grad;
  mark_grad_written(leaf);
  return Tensor();
}

bool grad_mode_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

void record_op(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
               BackwardFn backward) {
  if (!g_grad_enabled) return;
  bool any = false;
  for (const auto& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  for (const auto& t : inputs) node->next_edges.push_back(edge_for(t));
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    AutogradMeta& meta = outputs[i].impl()->autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = i;
  }
}

void run_backward(const Tensor& root, const Tensor& grad_root) {
  DPT_CHECK(root.requires_grad(), "backward: the tensor does not require grad and has no grad_fn");
  Tensor seed = grad_root;
  if (!seed.defined()) {
    DPT_CHECK(root.numel() == 1, "backward: a gradient must be given for a non-scalar output of shape {}",
              shape_str(root.shape()));
    seed = ones(root.shape(), root.options().with_requires_grad(false));
  }
  DPT_CHECK(seed.shape() == root.shape(), "backward: gradient shape {} does not match output shape {}",
            shape_str(seed.shape()), shape_str(root.shape()));
  NoGradGuard no_grad;
  Edge start = edge_for(root);

  // 1. Count, for every node reachable from the root, how many edges point into it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack{start.node.get()};
  dependencies[start.node.get()] = 0;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges) {
      if (!e.node) continue;
      if (dependencies[e.node.get()]++ == 0) stack.push_back(e.node.get());
    }
  }

  // 2. Run nodes whose inputs are complete: a leaf's AccumulateGrad first (its gradient is final, and its
  // hooks start DDP's communication while the rest of backward runs), then the most recently created.
  // A leaf's node cannot be ordered by its creation number: it outlives its graph while any tensor of
  // that graph is alive, so a forward pass run while the last step's loss still exists reuses it as
  // the oldest node of the new graph, and it would run only once nothing else is left.
  auto runs_after = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    if (a->leaf_sink != b->leaf_sink) return b->leaf_sink;
    return a->sequence_nr < b->sequence_nr;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(runs_after)> ready(
      runs_after);
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  buffers[start.node.get()].resize(start.node->num_outputs);
  buffers[start.node.get()][start.input_nr] = seed;
  ready.push(start.node);

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    grads.resize(node->num_outputs);
    bool any = false;
    for (const auto& g : grads) any = any || g.defined();
    std::vector<Tensor> input_grads;
    if (any || node->leaf_sink) input_grads = node->apply(grads);
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.node) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        auto& slot = buffers[e.node.get()];
        if (slot.size() < e.node->num_outputs) slot.resize(e.node->num_outputs);
        Tensor& acc = slot[e.input_nr];
        acc = acc.defined() ? add(acc, input_grads[i]) : input_grads[i];
      }
      if (--dependencies[e.node.get()] == 0) ready.push(e.node);
    }
  }
  run_backward_end_callbacks();
}

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  Tensor g = grad;
  // Leading dims that the input did not have: sum them away.
  while (g.dim() > static_cast<int64_t>(shape.size())) g = sum(g, 0, false);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1 && g.size(static_cast<int64_t>(d)) != 1) g = sum(g, static_cast<int64_t>(d), true);
  }
  return g.reshape(shape);
}

}  // namespace dpt
