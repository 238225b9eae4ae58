#include "step_graph.h"

#include <utility>

#include "core/error.h"

namespace dpt::train {

StepGraph::StepGraph(std::function<Tensor(const data::Batch&)> forward_backward)
    : forward_backward_(std::move(forward_backward)) {}

Tensor StepGraph::run(const data::Batch& batch) {
  if (!graph_) {
    DPT_CHECK(batch.input.device().is_cuda() && batch.target.device().is_cuda(),
              "training.cuda_graph: the batch must be on the GPU, found input on {}, target on {}",
              batch.input.device().str(), batch.target.device().str());
    // Allocated before the capture: ordinary memory the graph reads, refilled before every replay.
    inputs_ = {batch.input.clone(), batch.target.clone()};
    graph_ = std::make_unique<cuda::CudaGraph>();
    graph_->capture([&] { loss_ = forward_backward_(inputs_); });
  }
  DPT_CHECK(batch.input.shape() == inputs_.input.shape() && batch.target.shape() == inputs_.target.shape(),
            "training.cuda_graph: every batch must have the captured shape (input {}, target {}), found input {}, "
            "target {}",
            shape_str(inputs_.input.shape()), shape_str(inputs_.target.shape()), shape_str(batch.input.shape()),
            shape_str(batch.target.shape()));
  inputs_.input.copy_(batch.input);
  inputs_.target.copy_(batch.target);
  graph_->replay();
  return loss_;
}

}  // namespace dpt::train
