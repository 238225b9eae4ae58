#include "distributed/zero_optimizer.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"
#include "distributed/updating_exchange.h"
#include "optim/grad_clip.h"

namespace dpt::dist {

ZeroOptimizer::ZeroOptimizer(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups,
                             const Factory& make, UpdateTiming when)
    : ddp_(ddp), when_(when), shard_("ZeroOptimizer", groups) {
  NoGradGuard no_grad;
  const DDPOptions& options = ddp_.options();
  DPT_CHECK(!options.comm_dtype || ddp_.parameters().empty() ||
                *options.comm_dtype == ddp_.parameters().front().second.dtype(),
            "ZeroOptimizer: comm_dtype is not supported with sharded buckets");
  auto sharded = std::make_unique<ShardedExchange>(
      ddp_.process_group(), static_cast<size_t>(options.bucket_cap_mb * 1024 * 1024), options.copy_engines);
  exchange_ = sharded.get();
  if (when_ == UpdateTiming::OnStep) {
    ddp_.set_exchange(std::move(sharded));  // DDP only reduce-scatters; step() does the rest
  } else {
    auto update = [alive = alive_](const GradBucket& bucket) {
      if (*alive) (*alive)->on_bucket_reduced(bucket.index);
    };
    ddp_.set_exchange(std::make_unique<UpdatingExchange>(std::move(sharded), update, when_));
  }
  gather_group_ = exchange_->group();
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
  if (when_ == UpdateTiming::WhenReduced) {
    // The all-gathers queue behind updates; on the reduce-scatters' communicator they would hold back the
    // reduce-scatters of the buckets backward finishes meanwhile.
    gather_group_ = gather_group_->duplicate();
    // A copy-engine group's all-gathers need the parameters in one of its own symmetric windows.
    if (gather_group_->options().copy_engines) gather_group_->register_symmetric(exchange_->parameters());
  }
}

ZeroOptimizer::~ZeroOptimizer() { *alive_ = nullptr; }

// Runs once the current stream waits for bucket b's reduce-scatter: the compute stream at the end of
// backward, or the update stream when the reduce-scatter is launched (WhenReduced, updating_exchange.h), or
// the compute stream in step(). Nothing here allocates: on the update stream inside CUDA graph capture that would
// break the graph allocator's single-stream order (core/cuda/graph_memory.h).
void ZeroOptimizer::on_bucket_reduced(size_t b) {
  NoGradGuard no_grad;
  if (b == 0) inner_->begin_step();
  inner_->update(pieces_[b]);
  const Tensor& values = exchange_->param_buffer(b);
  const int64_t block = values.numel() / gather_group_->size();
  const int64_t mine = gather_group_->rank() * block;
  // Queued after update(b) on the current stream (the process group orders its stream after ours).
  gathers_.push_back(gather_group_->allgather(values, values.slice(mine, mine + block)));
  if (b + 1 == ddp_.num_buckets()) {
    // CUDA: the current stream waits (under WhenReduced the update stream, which the compute stream
    // joins at the end of backward); Gloo: the host does.
    for (auto& w : gathers_) w->wait();
    gathers_.clear();
  }
}

Tensor ZeroOptimizer::grad_sum_of_squares() {
  DPT_CHECK(when_ == UpdateTiming::OnStep,
            "ZeroOptimizer::grad_sum_of_squares: only when the update runs on step() (UpdateTiming::OnStep)");
  NoGradGuard no_grad;
  return optim::sum_of_squares(grad_blocks_, ddp_.parameters().front().second.device());
}

void ZeroOptimizer::step() {
  DPT_CHECK(when_ == UpdateTiming::OnStep, "ZeroOptimizer::step: the update already runs inside backward");
  if (!inner_->take_gate()) return;  // every rank reads the same gate: none updates or gathers
  for (size_t b = 0; b < ddp_.num_buckets(); ++b) on_bucket_reduced(b);
}

void ZeroOptimizer::gather_targets() { shard_.gather_targets(*ddp_.process_group(), ddp_.parameters()); }

NamedTensors ZeroOptimizer::full_state_dict() {
  return shard_.full_state_dict(*inner_, *ddp_.process_group(), ddp_.parameters());
}

void ZeroOptimizer::load_full_state_dict(const NamedTensors& full) { shard_.load_full_state_dict(*inner_, full); }

}  // namespace dpt::dist
