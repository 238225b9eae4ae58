#pragma once
// training.cuda_graph: a step's forward and backward (and, under DDP, the AllReduces its gradient hooks
// launch) captured once into a CUDA graph and replayed every later step, so the host enqueues one
// launch instead of hundreds of kernels. The optimizer, clipping, the non-finite check and the learning
// rate stay outside, eager: they read values on the host, which a replay could not.
//
// What a replay needs to equal an eager step:
//   - fixed memory: the batch is copied into the graph's own input tensors before each replay, and the
//     parameters and their gradients (DDP's bucket views, or the tensors the first eager steps made)
//     are updated in place by the optimizer, never reallocated;
//   - fixed host decisions: the capture sees gradients pending zero (zero_grad), so its backward
//     overwrites them, as every replay then does; zero_grad must not be called between replays (a
//     gradient read would then zero what the replay wrote);
//   - nothing random on the host: dropout's seeds would be frozen into the graph (refused by the config).
// The capture happens on a step after eager ones (library handles, the gradients, DDP's rebuilt
// buckets are all created by eager steps: a capture cannot create them).
#include <functional>
#include <memory>

#include "core/cuda_runtime.h"
#include "core/tensor.h"
#include "data/dataset.h"

namespace dpt::train {

class StepGraph {
 public:
  // `forward_backward(batch)` zeroes the gradients, runs the loss and its backward, and returns the loss.
  explicit StepGraph(std::function<Tensor(const data::Batch&)> forward_backward);

  // The first call captures (the batch copied into the graph's inputs first); every call, the first
  // included, then replays it on `batch`. The loss returned is rewritten by the next replay.
  Tensor run(const data::Batch& batch);

 private:
  std::function<Tensor(const data::Batch&)> forward_backward_;
  data::Batch inputs_;  // the graph's inputs: each step's batch is copied here
  Tensor loss_;         // the graph's output
  std::unique_ptr<cuda::CudaGraph> graph_;
};

}  // namespace dpt::train
