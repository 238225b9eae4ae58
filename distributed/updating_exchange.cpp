#include "distributed/updating_exchange.h"

#include "core/error.h"

namespace dpt::dist {

UpdatingExchange::UpdatingExchange(std::unique_ptr<BucketExchange> inner, Update update, UpdateTiming timing)
    : inner_(std::move(inner)), update_(std::move(update)), timing_(timing) {
  DPT_CHECK(inner_ != nullptr, "UpdatingExchange: no exchange to update behind");
  DPT_CHECK(timing_ != UpdateTiming::OnStep,
            "UpdatingExchange: OnStep updates run in the caller's step(), not in backward");
}

UpdatingExchange::~UpdatingExchange() = default;

BucketLayout UpdatingExchange::lay_out(const NamedTensors& params, const std::vector<BucketSpec>& specs) {
  BucketLayout layout = inner_->lay_out(params, specs);
  updated_.assign(layout.buckets.size(), false);
  return layout;
}

// Stream order: the update stream waits for the bucket's exchange, then runs the update's kernels; the
// compute stream joins the update stream in finish_backward, before anything reads the parameters.
void UpdatingExchange::launch(GradBucket& bucket) {
  inner_->launch(bucket);
  if (timing_ != UpdateTiming::WhenReduced || !bucket.buffer.device().is_cuda()) return;
  if (!update_stream_) update_stream_ = std::make_unique<SideStream>(bucket.buffer.device());
  SideStreamGuard on_updates(*update_stream_);
  inner_->finish(bucket);
  update_(bucket);
  updated_[bucket.index] = true;
}

void UpdatingExchange::finish(GradBucket& bucket) {
  if (updated_[bucket.index]) {  // waited for, and updated, on the update stream (joined below)
    updated_[bucket.index] = false;
    join_updates_ = true;
    return;
  }
  inner_->finish(bucket);
  update_(bucket);
}

void UpdatingExchange::finish_backward() {
  inner_->finish_backward();
  if (!join_updates_) return;
  join_updates_ = false;
  StreamEvent updates_done(update_stream_->device());
  updates_done.record(*update_stream_);
  updates_done.wait();
}

}  // namespace dpt::dist
