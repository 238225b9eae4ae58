#pragma once
// ZeRO-1's exchange (zero_optimizer.h): each bucket is reduce-scattered instead of all-reduced, so rank r
// receives the average of only its block [r*S, (r+1)*S) of the bucket; the rest of the bucket keeps this
// rank's local gradients.
//
// The layout: every gradient in one flat buffer, in the order of the specs, and the parameters moved
// (same handles, new storage: nn::replace_data) into a second flat buffer laid out alike, so the blocks each
// rank updated can be all-gathered in place. Buckets are consecutive ranges of the two, cut where a spec
// ends and inside a parameter larger than the cap every cap's worth (so a large parameter's update and
// all-gather start on its first part while the rest is still reduced). Every cut lies on a multiple of the
// world size, so each rank owns an equal block of every bucket, and a parameter may straddle two buckets
// (GradBucket::offsets is then negative in the second); its gradient and parameter stay one view each. The
// total is padded to a multiple of the world size; the padding is never a gradient and stays zero on every
// rank, so its reduced value is zero too. Needs one dtype and device for all parameters. The layout is
// frozen (no rebuild after the first iteration): optimizer shards are cut from it.
//
// copy_engines (CUDA): the reduce-scatters and the all-gathers move by the copy engines, not by NCCL kernels
// beside backward's. The flat buffers live in NCCL symmetric memory of an own communicator with the zero-CTA
// policy (NCCL 2.28+, one host, GPUs with peer access; elsewhere NCCL falls back to its kernels). A
// reduce-scatter becomes an all-to-all into a receive buffer as large as the gradients, then one averaging
// kernel per bucket (block_average.h), on the stream that waits for it.
#include <memory>
#include <vector>

#include "distributed/bucket_exchange.h"

namespace dpt::dist {

class ShardedExchange : public BucketExchange {
 public:
  ShardedExchange(std::shared_ptr<ProcessGroup> group, size_t cap_bytes, bool copy_engines);

  BucketLayout lay_out(const NamedTensors& params, const std::vector<BucketSpec>& specs) override;
  bool rebuildable() const override { return false; }
  void launch(GradBucket& bucket) override;
  void finish(GradBucket& bucket) override;
  std::string name() const override;

  // The group that moves the buckets (copy engines: its own, whose symmetric windows hold the flat
  // buffers), the flat parameters, and bucket b's range of them.
  const std::shared_ptr<ProcessGroup>& group() const { return ce_group_ ? ce_group_ : group_; }
  const Tensor& parameters() const { return params_; }
  const Tensor& param_buffer(size_t bucket) const { return param_buffers_.at(bucket); }

 private:
  void average_received(GradBucket& bucket);

  std::shared_ptr<ProcessGroup> group_;
  size_t cap_bytes_;
  bool copy_engines_;
  std::shared_ptr<ProcessGroup> ce_group_;  // copy engines on CUDA: the all-to-alls' group
  Tensor params_;                           // the flat parameters
  std::vector<Tensor> param_buffers_;       // [bucket] its range of params_
  std::vector<Tensor> received_;  // [bucket] copy engines: every rank's copy of this rank's block (all-to-all)
  const char* backend_ = "gloo";
};

}  // namespace dpt::dist
