#pragma once
// DistributedDataParallel: the model is replicated on every rank, each rank differentiates its own
// shard of the batch, and gradients are averaged across ranks while backward is still running.
//
// One step, as the code follows it:
//  1. Construction checks that every rank holds the same parameter names, shapes and dtypes (a
//     mismatch is an error on every rank naming the first differing parameter), broadcasts rank 0's
//     parameters and buffers, and lays the gradients out in buckets (grad_bucket.h) as its exchange
//     (bucket_exchange.h) wants them.
//  2. During backward, each parameter's grad-ready hook (core/autograd.h) marks it final in its
//     bucket. When the last gradient of a bucket is final, and every bucket before it has been
//     launched, the exchange launches the bucket (by default an asynchronous AllReduce on the process
//     group's communication stream, allreduce_exchange.h). Buckets launch strictly in index order on
//     every rank, so every rank issues the same collectives in the same order.
//  3. At the end of backward (a backward-end callback) buckets still holding parameters that received
//     no gradient are launched (find_unused_parameters; otherwise that is an error naming them), and the
//     exchange finishes every bucket in index order: the compute stream waits on it (an event wait, never
//     a host synchronisation on CUDA) and the bucket holds its result.
//  4. After the first iteration, buckets are rebuilt in the order gradients actually became ready
//     (unless the exchange's layout is frozen); rank 0's order is broadcast so every rank rebuilds
//     identically.
// Inside a no_sync() scope hooks do nothing: gradients accumulate in the buckets and are communicated
// by the first backward outside the scope (gradient accumulation).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "core/device_stream.h"
#include "core/tensor.h"
#include "distributed/bucket_exchange.h"
#include "distributed/grad_bucket.h"
#include "layers/module.h"

namespace dpt::dist {

struct DDPOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool find_unused_parameters = false;
  std::optional<DType> comm_dtype;  // e.g. bfloat16: communicate in it, accumulate back in float32
  bool rebuild_buckets = true;      // after the first iteration, in observed ready order
  bool broadcast_buffers = true;
  // A sharded optimizer's collectives on CUDA move by the copy engines, not by NCCL kernels beside
  // backward's: ZeRO-1's reduce-scatters and all-gathers (sharded_exchange.h), and gathered gradients'
  // all-gathers (gathered_linear_zero.h). No effect on unsharded buckets or Gloo.
  bool copy_engines = false;
};

// Per-bucket timing on CUDA, to show communication overlapping backward (see last_timings()).
struct BucketTiming {
  size_t bucket = 0;
  float launch_ms = 0;  // when the exchange was launched, relative to the backward's first hook
  float end_ms = 0;     // when it finished on the communication stream
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                          DDPOptions options = {});
  // For models that are not a Module: the parameters and buffers, with their names, in order.
  DistributedDataParallel(NamedTensors params, NamedTensors buffers, std::shared_ptr<ProcessGroup> group,
                          DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  Tensor forward(const Tensor& input) { return module_->forward(input); }

  // RAII scope that skips communication (gradient accumulation across micro-batches).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_enabled_) {
      ddp_.sync_enabled_ = false;
    }
    ~NoSyncGuard() { ddp_.sync_enabled_ = previous_; }

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Replaces what happens to ready buckets (by default AllReduceExchange with options.comm_dtype) and lays
  // the buckets out anew for it, in the current bucket order; gradients already accumulated move along.
  // Not during backward. A frozen layout (rebuildable() false) is never rebuilt after that.
  void set_exchange(std::unique_ptr<BucketExchange> exchange);
  // The exchange in use (owned by DDP): set_exchange's, or the default.
  BucketExchange& exchange() { return *exchange_; }

  const DDPOptions& options() const { return options_; }
  const GradBucket& bucket(size_t b) const { return buckets_.at(b); }
  const NamedTensors& parameters() const { return params_; }  // those that require grad, in order
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

  size_t num_buckets() const { return buckets_.size(); }
  std::string exchange_name() const { return exchange_->name(); }
  // Opt-in per-bucket CUDA event timing of the last synchronised backward (host-synchronises when read).
  void set_record_timing(bool on) { record_timing_ = on; }
  std::vector<BucketTiming> last_timings();
  float last_backward_end_ms() const { return backward_end_ms_; }  // valid after last_timings()

 private:
  struct TimingState;
  void verify_same_model_across_ranks();
  void broadcast_from_rank0();
  void build_buckets(const std::vector<size_t>& order);
  void register_hooks();
  void bind_grad_to_bucket(size_t param_index);
  void on_grad_ready(size_t param_index);
  void launch_ready_buckets();
  void launch(GradBucket& bucket);
  void finish_backward();
  void rebuild_from_observed_order();
  uint64_t instance_id();

  std::shared_ptr<nn::Module> module_;
  NamedTensors params_;  // only those that require grad
  NamedTensors buffers_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::unique_ptr<BucketExchange> exchange_;

  std::vector<GradBucket> buckets_;
  // Parameter index -> its gradient (a view into the buckets) and the buckets it lies in (one, unless a
  // sharded layout cut it).
  std::vector<Tensor> grads_;
  std::vector<size_t> first_bucket_of_, last_bucket_of_;
  std::vector<bool> ready_;          // parameter's gradient final in this backward
  std::vector<size_t> ready_order_;  // observed in the first synchronised backward
  size_t next_to_launch_ = 0;
  bool in_backward_ = false;
  bool sync_enabled_ = true;
  bool rebuilt_ = false;
  uint64_t callback_id_ = 0;

  // Hooks and the backward-end callback reach this object through a cell the destructor clears, so a
  // tensor outliving its DDP wrapper never calls into a dead object.
  std::shared_ptr<DistributedDataParallel*> alive_ = std::make_shared<DistributedDataParallel*>(this);
  std::optional<uint64_t> instance_id_;

  bool record_timing_ = false;
  std::unique_ptr<TimingState> timing_;           // the backward in flight
  std::unique_ptr<TimingState> finished_timing_;  // the last finished one
  float backward_end_ms_ = 0;
};

}  // namespace dpt::dist
