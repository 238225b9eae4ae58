#pragma once
// Define-by-run reverse-mode autodiff.
//
// Every differentiable op that sees an input requiring grad records a Node holding a backward
// function and one Edge per input. A leaf that requires grad is reached through its AccumulateGrad
// node, shared by all uses of that leaf.
//
// backward() runs nodes in dependency order: a node runs once every node that feeds it a gradient has
// run. A ready AccumulateGrad runs first; among the other ready nodes the most recently created runs
// first (highest sequence number), so the backward pass visits layers in reverse order of the forward
// pass. Each backward function runs at most once: it is released, with everything it saved, as soon as
// it returns (PyTorch without retain_graph), and a second backward through the same graph is an error
// naming the op.
//
// Grad-ready hook guarantee: a leaf's AccumulateGrad node becomes ready exactly when every use of that
// leaf in this graph has delivered its gradient; it then adds the sum into leaf.grad and calls the
// leaf's hooks, once per backward, on the calling thread, before backward() returns, with the
// gradient already final. Leaves are therefore reported in reverse order of their last use in the
// forward pass, interleaved with the rest of backward — which is what lets DDP start communicating
// a bucket while earlier layers are still being differentiated. CUDA work queued by the nodes is
// ordered on the current stream; a hook that hands the gradient to another stream must record an event.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dpt {

struct Edge {
  std::shared_ptr<Node> node;  // null when that input needs no gradient
  uint32_t input_nr = 0;       // which output of `node` the gradient is for
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  // Gradients w.r.t. this node's outputs (undefined where none flowed) -> gradients w.r.t. its inputs,
  // in the order of next_edges (undefined = no gradient).
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) = 0;
  virtual std::string name() const = 0;

  std::vector<Edge> next_edges;
  uint32_t num_outputs = 1;
  uint64_t sequence_nr;  // creation order; larger runs earlier among ready nodes
  bool leaf_sink = false;  // a leaf's AccumulateGrad: runs before any other ready node
};

using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

// Records `backward` as the grad_fn of `outputs` when grad mode is on and any input requires grad.
// Saved tensors captured by `backward` must be detach()ed copies of the handles: a captured output
// with its autograd state would own its own grad_fn and never be freed.
void record_op(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
               BackwardFn backward);

// A backward function that forms the whole gradient of a leaf (a linear layer's dW) may write it straight
// into leaf.grad when that buffer awaits its first gradient since zero_grad() (the deferred zeroing of
// AutogradMeta), instead of returning it for AccumulateGrad to copy there: one pass over every such
// gradient fewer a step. first_grad_buffer gives that buffer (contiguous, the leaf's shape and dtype;
// undefined when the gradient must be returned as usual); an op that overwrote all of it calls
// mark_grad_written and returns no gradient for that input. The leaf's AccumulateGrad still adds what
// its other uses deliver and calls the grad-ready hooks once, when every use is done.
Tensor first_grad_buffer(const Tensor& leaf);
void mark_grad_written(const Tensor& leaf);

// The same for a small gradient that a kernel writes into a tensor it is given (a bias's column sums, a
// norm's weight gradient), which saves the copy AccumulateGrad would make: grad_out_for gives the leaf's
// first_grad_buffer when it has this shape, dtype and device, else a new tensor. Once a kernel has written
// all of `grad`, grad_formed(leaf, grad) returns what the backward returns for the leaf: undefined after
// marking the buffer written when `grad` is that buffer, `grad` otherwise. Call it before asking for the
// same leaf's buffer again (a parameter used twice gets the buffer once).
Tensor grad_out_for(const Tensor& leaf, const Shape& shape, const TensorOptions& options);
Tensor grad_formed(const Tensor& leaf, const Tensor& grad);

// Runs the backward pass from `root` (gradient `grad_root`, which defaults to 1 for one element).
void run_backward(const Tensor& root, const Tensor& grad_root);

// Callbacks run at the end of every run_backward (any thread), after the last node ran and before
// backward() returns. DDP uses one to finish gradient synchronisation (launch buckets holding unused
// parameters, make the compute stream wait for communication). Returns an id for removal.
uint64_t add_backward_end_callback(std::function<void()> callback);
void remove_backward_end_callback(uint64_t id);

// Grad mode: thread-local; off inside NoGradGuard and while backward functions run.
bool grad_mode_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Sums a broadcast gradient back down to `shape` (the shape of the input that was broadcast).
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

}  // namespace dpt
