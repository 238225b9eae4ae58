#pragma once
// An optimizer update behind another exchange: `update(bucket)` runs once the bucket's exchange has
// finished, on the stream that waited for it, with UpdateTiming (update_timing.h) choosing when:
//
//  AtBackwardEnd: at the end of backward, as the compute stream waits for each bucket in turn:
//    compute stream:  ... backward ... | wait(X 0) update(0) | wait(X 1) update(1) | ...
//    comm stream:       X 0 ... X 1 ............ X 2 ...
//  WhenReduced (CUDA): the moment bucket k's exchange is launched, on the update stream, which waits for
//   that exchange; the compute stream waits for the update stream at the end of backward:
//    compute stream:  ... backward of layers L..1 ........................ | wait(update stream)
//    comm stream:           X 0 ...... X 1 ........ X 2 ...
//    update stream:               update(0)     update(1)     update(2)
//
// What optim::step_in_backward (overlapped_optimizer.h) and ZeroOptimizer (zero_optimizer.h) install on
// DDP. `update` must not allocate under WhenReduced: on the update stream inside CUDA graph capture that
// would break the graph allocator's single-stream order (core/cuda/graph_memory.h).
#include <functional>
#include <memory>
#include <vector>

#include "core/device_stream.h"
#include "distributed/bucket_exchange.h"
#include "distributed/update_timing.h"

namespace dpt::dist {

class UpdatingExchange : public BucketExchange {
 public:
  using Update = std::function<void(const GradBucket& bucket)>;
  // `timing`: AtBackwardEnd or WhenReduced (OnStep updates are the caller's, not an exchange's).
  UpdatingExchange(std::unique_ptr<BucketExchange> inner, Update update, UpdateTiming timing);
  ~UpdatingExchange() override;

  BucketLayout lay_out(const NamedTensors& params, const std::vector<BucketSpec>& specs) override;
  bool rebuildable() const override { return inner_->rebuildable(); }
  void launch(GradBucket& bucket) override;
  void finish(GradBucket& bucket) override;
  void finish_backward() override;
  std::string name() const override { return inner_->name(); }

  BucketExchange& inner() { return *inner_; }

 private:
  std::unique_ptr<BucketExchange> inner_;
  Update update_;
  UpdateTiming timing_;
  std::unique_ptr<SideStream> update_stream_;  // WhenReduced on CUDA (created on first use)
  std::vector<bool> updated_;                  // [bucket] its update already queued on the update stream
  bool join_updates_ = false;                  // in this backward, some update ran on the update stream
};

}  // namespace dpt::dist
