#pragma once
// The optimizer step inside backward, one gradient bucket at a time (like PyTorch's DDP communication
// hooks that run a fused optimizer per bucket). On CUDA the update of bucket k is queued on DDP's update
// stream the moment bucket k's AllReduce is launched, behind that AllReduce, so it runs while backward
// is still computing the earlier layers and buckets k+1.. are still on the wire:
//
//   compute stream:  ... backward of layers L..1 ............................ | wait(updates) | forward
//   comm stream:           AR 0 ...... AR 1 ........ AR 2 ...
//   update stream:               update(0)     update(1)     update(2)
//
// (DistributedDataParallel::HookTiming::WhenReduced). On CPU (Gloo) the updates run at the end of
// backward, bucket by bucket, as each AllReduce is waited for.
//
// After this call, `loss.backward()` performs the whole optimizer step: do not call opt.step() too.
// Every parameter's update depends only on its own averaged gradient, so the result equals backward +
// opt.step(). Not for global gradient-norm clipping, which needs every gradient before any update.
#include "distributed/ddp.h"
#include "optim/optimizer.h"

namespace dpt::dist {

// `timing` AtBackwardEnd queues every update on the compute stream after backward instead (the
// arrangement before the update stream; kept to compare the two).
inline void step_in_backward(
    DistributedDataParallel& ddp, optim::Optimizer& opt,
    DistributedDataParallel::HookTiming timing = DistributedDataParallel::HookTiming::WhenReduced) {
  ddp.set_bucket_reduced_hook(
      [&opt](size_t bucket, const std::vector<Tensor>& params) {
        if (bucket == 0) opt.begin_step();
        opt.update(params);
      },
      timing);
}

}  // namespace dpt::dist
