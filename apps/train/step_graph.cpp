#include "step_graph.h"

#include <utility>

#include "core/error.h"
#include "core/kernels.h"

namespace dpt::train {

StepGraph::StepGraph(std::function<Tensor(const data::Batch&)> forward_backward, Generator& gen)
    : forward_backward_(std::move(forward_backward)), gen_(&gen) {}

Tensor StepGraph::run(const data::Batch& batch) {
  if (!graph_) {
    DPT_CHECK(batch.input.device().is_cuda() && batch.target.device().is_cuda(),
              "training.cuda_graph: the batch must be on the GPU, found input on {}, target on {}",
              batch.input.device().str(), batch.target.device().str());
    // Allocated before the capture: ordinary memory the graph reads, refilled before every replay.
    inputs_ = {batch.input.clone(), batch.target.clone()};
    // Allocated before the capture too: the first replay's draws start where the generator stands.
    rng_counter_ = from_vector<int64_t>({static_cast<int64_t>(gen_->offset())}, {1},
                                        TensorOptions{}.with_dtype(DType::Int64).with_device(batch.input.device()));
    graph_ = std::make_unique<cuda::CudaGraph>();
    graph_->capture([&] {
      gen_->begin_capture(reinterpret_cast<const uint64_t*>(rng_counter_.data<int64_t>()));
      loss_ = forward_backward_(inputs_);
      drawn_per_replay_ = gen_->end_capture();
      if (drawn_per_replay_ > 0) kernels::advance_counter(rng_counter_, drawn_per_replay_);
    });
  }
  DPT_CHECK(batch.input.shape() == inputs_.input.shape() && batch.target.shape() == inputs_.target.shape(),
            "training.cuda_graph: every batch must have the captured shape (input {}, target {}), found input {}, "
            "target {}",
            shape_str(inputs_.input.shape()), shape_str(inputs_.target.shape()), shape_str(batch.input.shape()),
            shape_str(batch.target.shape()));
  inputs_.input.copy_(batch.input);
  inputs_.target.copy_(batch.target);
  graph_->replay();
  gen_->skip(drawn_per_replay_);
  return loss_;
}

}  // namespace dpt::train
