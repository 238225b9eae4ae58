#pragma once
// ZeRO stage 1 (Rajbhandari et al. 2020) on top of DistributedDataParallel: every rank keeps the whole
// model but updates, and keeps optimizer state for, only its 1/world block of each gradient bucket.
//
// One step:
// RS b: reduce-scatter of bucket b's gradients during backward (half the bytes of an AllReduce): rank r
//   receives the average of block r only.
// update(b): the optimizer on this rank's pieces of bucket b — a piece is the part of one parameter that
//   falls into the block, a 1-D view of the float32 parameter (or master) and of its gradient. Optimizer
//   state exists for pieces only: 1/world of it per rank. With bf16 compute twins, the fused update
//   reads the bf16 gradient piece and writes the bf16 parameter piece too (optim/optimizer.h).
// AG b: all-gather of bucket b's flat parameter buffer (the compute parameters, bf16 under mixed
//   precision), ordered after update(b) by the process group's stream event.
// Each element is updated by exactly one rank from the averaged gradient, so the parameters equal those of
// DDP + the full optimizer (the optimizers are elementwise).
//
// The exchange (sharded_exchange.h) is installed on DDP; when the updates run (UpdateTiming, update_timing.h):
//  AtBackwardEnd: inside loss.backward(), as the compute stream waits for each RS at the end of backward:
//     comm stream:     RS 0 .. RS 1 .. RS 2 ....................... AG 0 ... AG 1 ... AG 2
//     compute stream:  ... backward ... | wait(RS 0) update(0) | wait(RS 1) update(1) | ... | wait(AG *)
//  WhenReduced (CUDA; on Gloo as AtBackwardEnd): update(b) on the update stream (updating_exchange.h) as
//   soon as RS b is launched, AG b on a second communicator, so both overlap the rest of backward:
//     compute stream:  ... backward of layers L..1 ........................... | wait(update stream)
//     comm stream:          RS 0 ....... RS 1 ........ RS 2
//     update stream:              update(0) .. update(1) .. update(2) wait(AG *)
//     param stream:                      AG 0 ....... AG 1 ....... AG 2
//   Safe for the same reason as optim::step_in_backward: a bucket launches only once backward has queued
//   every kernel that reads its parameters.
//  OnStep: backward only reduce-scatters; step() updates and all-gathers under the inner optimizer's
//   gate, like a plain optimizer's step (what a trainer with clipping and skipped steps needs). On CUDA
//   step() returns with the gathers still running and the next forward waits for each bucket where it
//   first reads it: the buckets holding parameters outside the model's Sequential containers (a GPT's
//   embeddings and final LayerNorm) are updated and gathered first and waited for at the end of step();
//   then, in forward order, those of each Sequential child, which waits for its own just before it runs
//   (nn::Sequential::set_before_child). So the gathers of later blocks run beside the forward of earlier
//   ones:
//     compute stream:  update(early) update(block 0) .. update(block n) | wait(AG early) fwd | wait(AG 0) block 0 ..
//     comm stream:                   AG early ...... AG block 0 ......... AG block n
//   A bucket's `ready` event, recorded once its gather has ended, is what the forward waits on (a captured
//   forward through an event-wait node: each replay waits for the last eager step's gather); anything else
//   that reads the parameters after step() calls wait_for_parameters() first.
// In the first two, loss.backward() is the whole step and there is no gradient-norm clipping (it needs
// every gradient before any update).
// With DDPOptions::copy_engines the reduce-scatters and all-gathers go through the exchange's copy-engine
// group (ShardedExchange::group()), whose symmetric windows hold the flat buffers; the all-gathers' own group
// (WhenReduced) registers the parameters there too.
//
// After a step only this rank's block of each gradient bucket holds the averaged gradient, and the float32
// masters of mixed precision are current only where this rank updates them (the bf16 parameters are
// whole): gather_targets() makes them whole, full_state_dict() assembles the optimizer state of whole
// parameters (the names and shapes a plain optimizer over the same groups has), and
// load_full_state_dict() takes such a state back, so checkpoints move between ZeRO and plain runs and
// between world sizes. state_dict() of optimizer() is this rank's shard (piece names
// "<param>[begin:end]"). The whole step can be captured in a CUDA graph (cuda::CudaGraph) after an eager
// warm-up step: the collectives become graph nodes; build the inner AdamW with count_steps_on_device()
// so replays advance its step (apps/bench/train_bench.cpp does).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device_stream.h"
#include "distributed/ddp.h"
#include "distributed/shard_pieces.h"
#include "distributed/sharded_exchange.h"
#include "distributed/sharded_optimizer.h"
#include "distributed/update_timing.h"
#include "optim/optimizer.h"

namespace dpt::nn {
class Sequential;
}

namespace dpt::dist {

class ZeroOptimizer : public ShardedOptimizer {
 public:
  // Builds the inner optimizer over this rank's pieces (distributed/shard_pieces.h).
  using Factory = ShardPieces::Factory;

  // `groups`: the parameters the optimizer updates, with their weight decay and lr scale — DDP's
  // parameters themselves when they are float32, or the float32 masters of mixed precision
  // (optim::MixedPrecision::master_params(), same names as DDP's bf16 parameters, which then act as
  // compute twins). Installs a ShardedExchange on `ddp` (behind an UpdatingExchange unless `when` is
  // OnStep, so that `loss.backward()` performs the whole optimizer step); it stays after this object ends,
  // without the updates. `ddp`'s exchange must not be replaced while this object lives.
  ZeroOptimizer(DistributedDataParallel& ddp, const std::vector<optim::ParamGroup>& groups, const Factory& make,
                UpdateTiming when = UpdateTiming::AtBackwardEnd);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  optim::Optimizer& optimizer() override { return *inner_; }      // learning rate, state dict of this rank's shard
  int64_t sharded_elements() const { return sharded_elements_; }  // parameter elements this rank updates

  // OnStep only (distributed/sharded_optimizer.h): the ranks' blocks are disjoint and together hold every
  // averaged gradient.
  Tensor grad_sum_of_squares() override;
  void step() override;
  void wait_for_parameters() override;
  // The buckets in the order step() updates and gathers them (see the top), for tests.
  const std::vector<size_t>& step_order() const { return step_order_; }

  // Any mode (distributed/sharded_optimizer.h).
  void gather_targets() override;
  NamedTensors full_state_dict() override;
  void load_full_state_dict(const NamedTensors& full) override;

 private:
  void on_bucket_reduced(size_t bucket);
  std::shared_ptr<Work> gather(size_t bucket);  // this rank's block of the bucket's parameters to every rank
  void plan_forward_waits();

  DistributedDataParallel& ddp_;
  UpdateTiming when_;
  ShardedExchange* exchange_ = nullptr;  // owned by ddp_
  ShardPieces shard_;                    // this rank's pieces, and whole tensors from every rank's (checkpoints)
  std::unique_ptr<optim::Optimizer> inner_;
  std::vector<std::vector<Tensor>> pieces_;     // [bucket] -> this rank's pieces (the optimizer's parameters)
  std::vector<Tensor> grad_blocks_;             // [bucket] -> this rank's averaged block of the gradients
  std::shared_ptr<ProcessGroup> gather_group_;  // the all-gathers' communicator (own one under WhenReduced)
  std::vector<std::shared_ptr<Work>> gathers_;
  // OnStep (see the top): the order step() updates and gathers the buckets in, how many of them step()
  // waits for itself, each bucket's `ready` event and the stream that records it (on the CPU they do
  // nothing: the host waits for each gather), and the Sequentials whose children wait.
  std::vector<size_t> step_order_;
  size_t waited_in_step_ = 0;
  std::vector<StreamEvent> ready_;
  std::unique_ptr<SideStream> ready_stream_;
  std::vector<std::shared_ptr<nn::Sequential>> hooked_;
  int64_t sharded_elements_ = 0;
  // The update DDP's exchange calls reaches this object through a cell the destructor clears.
  std::shared_ptr<ZeroOptimizer*> alive_ = std::make_shared<ZeroOptimizer*>(this);
};

}  // namespace dpt::dist
