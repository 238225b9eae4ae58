#include "distributed/zero_optimizer.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"
#include "distributed/shard_pieces.h"

namespace dpt::dist {

ZeroOptimizer::ZeroOptimizer(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups,
                             const Factory& make)
    : ddp_(ddp) {
  NoGradGuard no_grad;
  ddp_.shard_buckets();
  ShardPieces shard("ZeroOptimizer", groups);
  const NamedTensors& params = ddp_.parameters();
  const int64_t world = ddp_.process_group()->size();
  const int64_t rank = ddp_.process_group()->rank();
  pieces_.resize(ddp_.num_buckets());
  for (size_t b = 0; b < ddp_.num_buckets(); ++b) {
    const GradBucket& bucket = ddp_.bucket(b);
    const int64_t block = bucket.buffer.numel() / world;
    const int64_t mine_begin = rank * block, mine_end = mine_begin + block;
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const auto& [name, p] = params[bucket.params[j]];
      shard.cover(name, p);
      // The part of this parameter inside this rank's block, in parameter and in bucket coordinates.
      const int64_t offset = bucket.offsets[j];
      const int64_t lo = std::max(offset, mine_begin), hi = std::min(offset + p.numel(), mine_end);
      if (lo >= hi) continue;
      // The reduce-scattered average lands in the bucket's range.
      pieces_[b].push_back(shard.add(name, p, lo - offset, hi - offset, flat_range(bucket.buffer, lo, hi)));
    }
  }
  sharded_elements_ = shard.elements();
  inner_ = shard.make_optimizer(make);
  ddp_.set_bucket_reduced_hook([this](size_t bucket, const std::vector<Tensor>&) { on_bucket_reduced(bucket); });
}

ZeroOptimizer::~ZeroOptimizer() { ddp_.set_bucket_reduced_hook(nullptr); }

// Runs at the end of backward once the compute stream waits for bucket b's reduce-scatter (ddp.h).
void ZeroOptimizer::on_bucket_reduced(size_t b) {
  NoGradGuard no_grad;
  if (b == 0) inner_->begin_step();
  inner_->update(pieces_[b]);
  const GradBucket& bucket = ddp_.bucket(b);
  const auto& group = ddp_.process_group();
  const int64_t block = bucket.param_buffer.numel() / group->size();
  const int64_t mine = group->rank() * block;
  // Queued after update(b) on the compute stream (the process group orders its stream after ours).
  gathers_.push_back(group->allgather(bucket.param_buffer, bucket.param_buffer.slice(mine, mine + block)));
  if (b + 1 == ddp_.num_buckets()) {
    for (auto& w : gathers_) w->wait();  // CUDA: the compute stream waits; Gloo: the host does
    gathers_.clear();
  }
}

}  // namespace dpt::dist
