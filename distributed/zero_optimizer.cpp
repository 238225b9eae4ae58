#include "distributed/zero_optimizer.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"

namespace dpt::dist {

ZeroOptimizer::ZeroOptimizer(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups,
                             const Factory& make, When when)
    : ddp_(ddp), when_(when), shard_("ZeroOptimizer", groups) {
  NoGradGuard no_grad;
  ddp_.shard_buckets();
  gather_group_ = ddp_.sharded_exchange_group();
  const NamedTensors& params = ddp_.parameters();
  const int64_t world = ddp_.process_group()->size();
  const int64_t rank = ddp_.process_group()->rank();
  pieces_.resize(ddp_.num_buckets());
  for (size_t b = 0; b < ddp_.num_buckets(); ++b) {
    const GradBucket& bucket = ddp_.bucket(b);
    const int64_t block = bucket.buffer.numel() / world;
    const int64_t mine_begin = rank * block, mine_end = mine_begin + block;
    grad_blocks_.push_back(bucket.buffer.slice(mine_begin, mine_end));
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const auto& [name, p] = params[bucket.params[j]];
      shard_.cover(name, p);
      // The part of this parameter inside this rank's block, in parameter and in bucket coordinates.
      const int64_t offset = bucket.offsets[j];
      const int64_t lo = std::max(offset, mine_begin), hi = std::min(offset + p.numel(), mine_end);
      if (lo >= hi) continue;
      // The reduce-scattered average lands in the bucket's range.
      pieces_[b].push_back(shard_.add(name, p, lo - offset, hi - offset, flat_range(bucket.buffer, lo, hi)));
    }
  }
  sharded_elements_ = shard_.elements();
  inner_ = shard_.make_optimizer(make);
  if (when_ == When::OnStep) return;  // DDP only reduce-scatters; step() does the rest
  if (when_ == When::DuringBackward) {
    // The all-gathers queue behind updates; on the reduce-scatters' communicator they would hold back the
    // reduce-scatters of the buckets backward finishes meanwhile.
    gather_group_ = gather_group_->duplicate();
    // A copy-engine group's all-gathers need the parameters in one of its own symmetric windows.
    if (gather_group_->options().copy_engines) gather_group_->register_symmetric(ddp_.sharded_parameters());
  }
  using Timing = DistributedDataParallel::HookTiming;
  ddp_.set_bucket_reduced_hook([this](size_t bucket, const std::vector<Tensor>&) { on_bucket_reduced(bucket); },
                               when_ == When::DuringBackward ? Timing::WhenReduced : Timing::AtBackwardEnd);
}

ZeroOptimizer::~ZeroOptimizer() {
  if (when_ != When::OnStep) ddp_.set_bucket_reduced_hook(nullptr);
}

// Runs once the current stream waits for bucket b's reduce-scatter (ddp.h): the compute stream at the end
// of backward, or DDP's update stream when the reduce-scatter is launched (DuringBackward), or the compute
// stream in step(). Nothing here allocates: on the update stream inside CUDA graph capture that would
// break the graph allocator's single-stream order (core/cuda/graph_memory.h).
void ZeroOptimizer::on_bucket_reduced(size_t b) {
  NoGradGuard no_grad;
  if (b == 0) inner_->begin_step();
  inner_->update(pieces_[b]);
  const GradBucket& bucket = ddp_.bucket(b);
  const int64_t block = bucket.param_buffer.numel() / gather_group_->size();
  const int64_t mine = gather_group_->rank() * block;
  // Queued after update(b) on the current stream (the process group orders its stream after ours).
  gathers_.push_back(gather_group_->allgather(bucket.param_buffer, bucket.param_buffer.slice(mine, mine + block)));
  if (b + 1 == ddp_.num_buckets()) {
    // CUDA: the current stream waits (under DuringBackward the update stream, which the compute stream
    // joins at the end of backward); Gloo: the host does.
    for (auto& w : gathers_) w->wait();
    gathers_.clear();
  }
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  DPT_CHECK(when_ == When::OnStep,
            "ZeroOptimizer::clip_grad_norm: only when the update runs on step() (When::OnStep)");
  // The ranks' blocks are disjoint and together hold every averaged gradient.
  return clip_spread_grad_norm(*ddp_.process_group(), grad_blocks_, grad_blocks_, max_norm);
}

void ZeroOptimizer::step() {
  DPT_CHECK(when_ == When::OnStep, "ZeroOptimizer::step: the update already runs inside backward");
  for (size_t b = 0; b < ddp_.num_buckets(); ++b) on_bucket_reduced(b);
}

void ZeroOptimizer::gather_targets() { shard_.gather_targets(*ddp_.process_group(), ddp_.parameters()); }

NamedTensors ZeroOptimizer::full_state_dict() {
  return shard_.full_state_dict(*inner_, *ddp_.process_group(), ddp_.parameters());
}

void ZeroOptimizer::load_full_state_dict(const NamedTensors& full) { shard_.load_full_state_dict(*inner_, full); }

}  // namespace dpt::dist
