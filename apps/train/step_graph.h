#pragma once
// training.cuda_graph: a step's forward and backward (and, under DDP, the AllReduces its gradient hooks
// launch and the ranks' agreement on loss and stop) captured once into a CUDA graph and replayed every
// later step, so the host enqueues one launch instead of hundreds of kernels. The norm, the clip and skip
// decision and the optimizer stay outside, launched eagerly behind each replay: the learning rate they use
// is set on the host every step, which a replay could not hold.
//
// What a replay needs to equal an eager step:
//   - fixed memory: the batch is copied into the graph's own input tensors before each replay, and the
//     parameters and their gradients (DDP's bucket views, or the tensors the first eager steps made)
//     are updated in place by the optimizer, never reallocated;
//   - fixed host decisions: the capture sees gradients pending zero (zero_grad), so its backward
//     overwrites them, as every replay then does; zero_grad must not be called between replays (a
//     gradient read would then zero what the replay wrote);
//   - nothing random fixed on the host: dropout draws relative to a device counter that the graph itself
//     moves on at the end of every replay (Generator::begin_capture), and the host generator skips the
//     same count after each replay, so its offset (what checkpoints save) matches an eager run's.
// The capture happens on a step after eager ones (library handles, the gradients, DDP's rebuilt
// buckets are all created by eager steps: a capture cannot create them).
#include <functional>
#include <memory>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/tensor.h"
#include "data/dataset.h"

namespace dpt::train {

class StepGraph {
 public:
  // `forward_backward(batch)` zeroes the gradients, runs the loss and its backward, and returns the loss.
  // `gen` is the generator the model's dropout draws from.
  StepGraph(std::function<Tensor(const data::Batch&)> forward_backward, Generator& gen);

  // The first call captures (the batch copied into the graph's inputs first); every call, the first
  // included, then replays it on `batch`. The loss returned is rewritten by the next replay.
  Tensor run(const data::Batch& batch);

 private:
  std::function<Tensor(const data::Batch&)> forward_backward_;
  Generator* gen_;
  Tensor rng_counter_;           // int64 [1] on the GPU: the offset the next replay's draws start from
  uint64_t drawn_per_replay_ = 0;
  data::Batch inputs_;  // the graph's inputs: each step's batch is copied here
  Tensor loss_;         // the graph's output
  std::unique_ptr<cuda::CudaGraph> graph_;
};

}  // namespace dpt::train
