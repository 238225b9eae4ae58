#pragma once
// The optimizer step inside backward, one gradient bucket at a time (like PyTorch's DDP communication
// hooks that run a fused optimizer per bucket). By default (HookTiming::AtBackwardEnd) DDP finishes
// buckets in order at the end of backward; as soon as the compute stream has waited for bucket k's
// AllReduce, the update of bucket k's parameters is queued behind it, so it runs while buckets k+1.. are
// still on the wire:
//
//   compute stream:  ... backward ... | wait(AR 0) update(0) | wait(AR 1) update(1) | ...
//   comm stream:       AR 0 ... AR 1 ............ AR 2 ...
//
// With HookTiming::WhenReduced (CUDA) the update of bucket k is queued on DDP's update stream the moment
// bucket k's AllReduce is launched, so it also overlaps the rest of backward:
//
//   compute stream:  ... backward of layers L..1 ........................ | wait(update stream) | forward
//   comm stream:           AR 0 ...... AR 1 ........ AR 2 ...
//   update stream:               update(0)     update(1)     update(2)
//
// On 2 x H200 neither is faster everywhere (docs/performance.md): the update stream
// gained 1-4% on the MLP and lost 0.7% on GPT-2, whose AdamW then competes with backward for memory
// bandwidth. On CPU (Gloo) the updates always run at the end of backward.
//
// After this call, `loss.backward()` performs the whole optimizer step: do not call opt.step() too.
// Every parameter's update depends only on its own averaged gradient, so the result equals backward +
// opt.step(). Not for global gradient-norm clipping, which needs every gradient before any update.
#include "distributed/ddp.h"
#include "optim/optimizer.h"

namespace dpt::dist {

inline void step_in_backward(
    DistributedDataParallel& ddp, optim::Optimizer& opt,
    DistributedDataParallel::HookTiming timing = DistributedDataParallel::HookTiming::AtBackwardEnd) {
  ddp.set_bucket_reduced_hook(
      [&opt](size_t bucket, const std::vector<Tensor>& params) {
        if (bucket == 0) opt.begin_step();
        opt.update(params);
      },
      timing);
}

}  // namespace dpt::dist
