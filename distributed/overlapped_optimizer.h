#pragma once
// The optimizer step inside backward, one gradient bucket at a time (like PyTorch's DDP communication
// hooks that run a fused optimizer per bucket): DDP's all-reduce exchange behind an UpdatingExchange
// (updating_exchange.h), whose update is the optimizer's on the bucket's parameters. With
// UpdateTiming::AtBackwardEnd, as soon as the compute stream has waited for bucket k's AllReduce, the update
// of bucket k's parameters is queued behind it, so it runs while buckets k+1.. are still on the wire; with
// UpdateTiming::WhenReduced (CUDA) it is queued on the update stream the moment bucket k's AllReduce is
// launched, so it also overlaps the rest of backward.
//
// Neither is faster everywhere (docs/performance.md): on the update stream a large model's AdamW
// competes with backward for memory bandwidth. On CPU (Gloo) the updates always run at the end of
// backward.
//
// After this call, `loss.backward()` performs the whole optimizer step: do not call opt.step() too.
// Every parameter's update depends only on its own averaged gradient, so the result equals backward +
// opt.step(). Not for global gradient-norm clipping, which needs every gradient before any update.
#include <memory>
#include <vector>

#include "distributed/allreduce_exchange.h"
#include "distributed/ddp.h"
#include "distributed/update_timing.h"
#include "distributed/updating_exchange.h"
#include "optim/optimizer.h"

namespace dpt::dist {

inline void step_in_backward(DistributedDataParallel& ddp, optim::Optimizer& opt,
                             UpdateTiming timing = UpdateTiming::AtBackwardEnd) {
  const NamedTensors& params = ddp.parameters();  // lives as long as ddp, which owns the exchange
  auto update = [&opt, &params](const GradBucket& bucket) {
    if (bucket.index == 0) opt.begin_step();
    std::vector<Tensor> tensors;
    for (size_t i : bucket.params) tensors.push_back(params[i].second);
    opt.update(tensors);
  };
  ddp.set_exchange(std::make_unique<UpdatingExchange>(
      std::make_unique<AllReduceExchange>(ddp.process_group(), ddp.options().comm_dtype), update, timing));
}

}  // namespace dpt::dist
