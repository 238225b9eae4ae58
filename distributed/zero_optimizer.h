#pragma once
// ZeRO stage 1 (Rajbhandari et al. 2020) on top of DistributedDataParallel: every rank keeps the whole
// model but updates, and keeps optimizer state for, only its 1/world block of each gradient bucket.
//
// Per step, inside backward (the optimizer step happens there, as with dist::step_in_backward):
//   comm stream:     RS 0 .. RS 1 .. RS 2 ....................... AG 0 ... AG 1 ... AG 2
//   compute stream:  ... backward ... | wait(RS 0) update(0) | wait(RS 1) update(1) | ... | wait(AG *)
// RS b: reduce-scatter of bucket b's gradients (half the bytes of an AllReduce): rank r receives the
//   average of block r only.
// update(b): the optimizer on this rank's pieces of bucket b — a piece is the part of one parameter that
//   falls into the block, a 1-D view of the float32 parameter (or master) and of its gradient. Optimizer
//   state exists for pieces only: 1/world of it per rank. With bf16 compute twins, the fused update
//   reads the bf16 gradient piece and writes the bf16 parameter piece too (optim/optimizer.h).
// AG b: all-gather of bucket b's flat parameter buffer (the compute parameters, bf16 under mixed
//   precision), ordered after update(b) by the process group's stream event; it overlaps update(b+1..).
// The compute stream waits for every AG after the last bucket's update, before anything reads the
// parameters again.
//
// With HookTiming::WhenReduced (CUDA) update(b) runs on DDP's update stream as soon as RS b has been
// launched (the stream waits for it), and AG b on a second communicator, so both overlap the rest of
// backward instead of following it; only the buckets that become final last are left for the end:
//   compute stream:  ... backward of layers L..1 ........................... | wait(update stream)
//   comm stream:          RS 0 ....... RS 1 ........ RS 2
//   update stream:              update(0) .. update(1) .. update(2) wait(AG *)
//   param stream:                      AG 0 ....... AG 1 ....... AG 2
// Safe for the same reason as optim::step_in_backward: a bucket launches only once backward has queued
// every kernel that reads its parameters. Each element is updated by exactly one rank from the averaged gradient, so the
// parameters equal those of DDP + the full optimizer (AdamW is elementwise).
//
// Limits: no global gradient-norm clipping (it needs every gradient before any update); after a step
// only this rank's block of each gradient bucket holds the averaged gradient; the state dict is this
// rank's shard (piece names "<param>[begin:end]"), so resuming needs the same world size and buckets.
// float32 masters of mixed precision stay whole on every rank (only Adam's moments are sharded).
// The whole step can be captured in a CUDA graph (cuda::CudaGraph) after an eager warm-up step: the
// collectives become graph nodes; build the inner AdamW with count_steps_on_device() so replays advance
// its step (apps/bench/train_bench.cpp does).
#include <functional>
#include <memory>
#include <vector>

#include "distributed/ddp.h"
#include "distributed/shard_pieces.h"
#include "optim/optimizer.h"

namespace dpt::dist {

class ZeroOptimizer {
 public:
  // Builds the inner optimizer over this rank's pieces (distributed/shard_pieces.h).
  using Factory = ShardPieces::Factory;

  // `groups`: the parameters the optimizer updates, with their weight decay and lr scale — DDP's
  // parameters themselves when they are float32, or the float32 masters of mixed precision
  // (optim::MixedPrecision::master_params(), same names as DDP's bf16 parameters, which then act as
  // compute twins). Shards `ddp`'s buckets (DistributedDataParallel::shard_buckets) and takes over its
  // bucket hook: after this, `loss.backward()` performs the whole optimizer step. `timing`: when the
  // updates run (see above); on Gloo they always run at the end of backward.
  ZeroOptimizer(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups, const Factory& make,
                DistributedDataParallel::HookTiming timing = DistributedDataParallel::HookTiming::AtBackwardEnd);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  optim::Optimizer& optimizer() { return *inner_; }  // learning rate, state dict of this rank's shard
  int64_t sharded_elements() const { return sharded_elements_; }  // parameter elements this rank updates

 private:
  void on_bucket_reduced(size_t bucket);

  DistributedDataParallel& ddp_;
  std::unique_ptr<optim::Optimizer> inner_;
  std::vector<std::vector<Tensor>> pieces_;  // [bucket] -> this rank's pieces (the optimizer's parameters)
  std::shared_ptr<ProcessGroup> gather_group_;  // the all-gathers' communicator (own one under WhenReduced)
  std::vector<std::shared_ptr<Work>> gathers_;
  int64_t sharded_elements_ = 0;
};

}  // namespace dpt::dist
