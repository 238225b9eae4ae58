#pragma once
// DistributedDataParallel: the model is replicated on every rank, each rank differentiates its own
// shard of the batch, and gradients are averaged across ranks while backward is still running.
//
// One step, as the code follows it:
//  1. Construction checks that every rank holds the same parameter names, shapes and dtypes (a
//     mismatch is an error on every rank naming the first differing parameter), broadcasts rank 0's
//     parameters and buffers, and lays the gradients out in buckets (grad_bucket.h).
//  2. During backward, each parameter's grad-ready hook (core/autograd.h) marks it final in its
//     bucket. When the last gradient of a bucket is final, and every bucket before it has been
//     launched, the bucket is averaged by an asynchronous AllReduce (NCCL: ncclAvg, the 1/world scale
//     inside the reduction kernel; Gloo: pre-scaled by 1/world, then summed) on the process group's
//     communication stream. Buckets launch strictly in index order on every rank, so every rank issues
//     the same collectives in the same order.
//  3. At the end of backward (a backward-end callback) buckets still holding parameters that received
//     no gradient are launched (find_unused_parameters; otherwise that is an error naming them), and the
//     compute stream waits on every AllReduce — an event wait, never a host synchronisation on CUDA.
//     Buckets communicated in comm_dtype (bf16) are converted back into the float32 gradients here.
//  4. After the first iteration, buckets are rebuilt in the order gradients actually became ready;
//     rank 0's order is broadcast so every rank rebuilds identically.
// Inside a no_sync() scope hooks do nothing: gradients accumulate in the buckets and are communicated
// by the first backward outside the scope (gradient accumulation).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/grad_bucket.h"
#include "distributed/process_group.h"
#include "layers/module.h"

namespace dpt::dist {

struct DDPOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool find_unused_parameters = false;
  std::optional<DType> comm_dtype;  // e.g. bfloat16: communicate in it, accumulate back in float32
  bool rebuild_buckets = true;      // after the first iteration, in observed ready order
  bool broadcast_buffers = true;
  // Sharded buckets (shard_buckets, ZeRO-1) on CUDA: move the bytes of the reduce-scatters and of the
  // all-gathers with the copy engines, not with NCCL kernels beside backward's. The buckets live in NCCL
  // symmetric memory and go through a communicator with the zero-CTA policy (NCCL 2.28+, one host, GPUs with
  // peer access; elsewhere NCCL falls back to its kernels). A reduce-scatter becomes an all-to-all into a
  // receive buffer as large as the gradients, then one averaging kernel per bucket. No effect on unsharded
  // buckets or Gloo.
  bool copy_engines = false;
};

// Per-bucket timing on CUDA, to show communication overlapping backward (see overlap_report()).
struct BucketTiming {
  size_t bucket = 0;
  float launch_ms = 0;  // when the AllReduce was queued, relative to the backward's first hook
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

  // Called at the end of each synchronised backward for every bucket, in bucket order, right after the
  // compute stream (CUDA) or the host (Gloo) has waited for that bucket's AllReduce, with the bucket's
  // index and parameters. Work queued here on the compute stream overlaps the AllReduces of the buckets
  // after it: optim::step_in_backward (distributed/overlapped_optimizer.h) runs the optimizer this way.
  using BucketHook = std::function<void(size_t bucket, const std::vector<Tensor>& params)>;
  // When the hook runs. AtBackwardEnd: as described above. WhenReduced (CUDA buckets): the
  // moment a bucket's AllReduce is launched, the hook is called with a side stream (the update stream)
  // current, after that stream has waited for the AllReduce; so its work runs while backward is still
  // computing earlier layers. The compute stream waits for the update stream at the end of backward.
  // Safe for an optimizer step: a bucket launches only when its last gradient is final, and by then
  // backward has queued every kernel that reads those parameters.
  enum class HookTiming { AtBackwardEnd, WhenReduced };
  void set_bucket_reduced_hook(BucketHook hook, HookTiming timing = HookTiming::AtBackwardEnd) {
    bucket_hook_ = std::move(hook);
    hook_timing_ = timing;
  }

  // ZeRO-1 (distributed/zero_optimizer.h). From here on each bucket is reduce-scattered instead of
  // all-reduced: rank r receives the average of only its block [r*S, (r+1)*S) of the bucket; the rest of
  // the bucket keeps this rank's local gradients. All gradients move into one flat buffer and the
  // parameters into a second one laid out alike (GradBucket::param_buffer slices it), so the blocks each
  // rank updated can be all-gathered in place; buckets are consecutive ranges of them, cut on multiples
  // of the world size, and a parameter larger than the cap is cut into several buckets (so may straddle
  // two; GradBucket::offsets is then negative). Needs one dtype and device for all parameters. The
  // layout is frozen (no rebuild after the first iteration): optimizer shards are cut from it. Call
  // before the first backward.
  void shard_buckets();
  bool sharded() const { return sharded_; }
  const GradBucket& bucket(size_t b) const { return buckets_.at(b); }
  const NamedTensors& parameters() const { return params_; }  // those that require grad, in order
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }
  // Sharded buckets: the group that exchanges them (DDPOptions::copy_engines: its own copy-engine group,
  // whose symmetric windows hold the flat gradients and parameters), and the flat parameters.
  const std::shared_ptr<ProcessGroup>& sharded_exchange_group() const { return ce_group_ ? ce_group_ : group_; }
  const Tensor& sharded_parameters() const { return sharded_params_; }

  size_t num_buckets() const { return buckets_.size(); }
  // What averages the buckets now: "nccl (copy engines)" (copy_engines), "nccl" or "gloo".
  const char* exchange_name() const;
  // Parameter names of each bucket, in bucket order (for tests and logs).
  std::vector<std::vector<std::string>> bucket_layout() const;
  // Opt-in per-bucket CUDA event timing of the last synchronised backward (host-synchronises when read).
  void set_record_timing(bool on) { record_timing_ = on; }
  std::vector<BucketTiming> last_timings();
  float last_backward_end_ms() const { return backward_end_ms_; }  // valid after last_timings()

 private:
  void verify_same_model_across_ranks();
  void take_reduced(GradBucket& bucket);
  void average_received(GradBucket& bucket);
  void broadcast_from_rank0();
  void build_buckets(const std::vector<size_t>& order);
  void build_sharded_buckets(const std::vector<BucketSpec>& specs);
  void register_hooks();
  Tensor bucket_view(size_t param_index) const;  // the parameter's slice of its bucket, in its shape
  void bind_grad_to_bucket(size_t param_index);
  void on_grad_ready(size_t param_index);
  void launch_ready_buckets();
  void launch(GradBucket& bucket);
  void finish_backward();
  void run_hook_when_reduced(size_t index, GradBucket& bucket);
  std::vector<Tensor> bucket_params(const GradBucket& bucket) const;
  void rebuild_from_observed_order();
  uint64_t instance_id();

  std::shared_ptr<nn::Module> module_;
  NamedTensors params_;   // only those that require grad
  NamedTensors buffers_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;

  std::vector<GradBucket> buckets_;
  // Parameter index -> the buckets its gradient lies in (one, unless sharded buckets cut it), and the
  // offset of its gradient in its bucket's buffer (sharded: in sharded_grads_, which the buckets slice).
  std::vector<size_t> first_bucket_of_, last_bucket_of_;
  std::vector<int64_t> grad_offset_;
  Tensor sharded_grads_;
  Tensor sharded_params_;
  // DDPOptions::copy_engines with sharded CUDA buckets: the all-to-alls' group.
  std::shared_ptr<ProcessGroup> ce_group_;
  std::vector<bool> ready_;              // parameter's gradient final in this backward
  std::vector<size_t> ready_order_;      // observed in the first synchronised backward
  size_t next_to_launch_ = 0;
  bool in_backward_ = false;
  bool sync_enabled_ = true;
  bool rebuilt_ = false;
  bool sharded_ = false;
  uint64_t callback_id_ = 0;
  BucketHook bucket_hook_;
  HookTiming hook_timing_ = HookTiming::AtBackwardEnd;
  struct UpdateStream;
  std::unique_ptr<UpdateStream> update_stream_;  // WhenReduced hooks run here (created on first use)

  // Hooks and the backward-end callback reach this object through a cell the destructor clears, so a
  // tensor outliving its DDP wrapper never calls into a dead object.
  std::shared_ptr<DistributedDataParallel*> alive_ = std::make_shared<DistributedDataParallel*>(this);
  std::optional<uint64_t> instance_id_;

  bool record_timing_ = false;
  struct TimingState;
  std::unique_ptr<TimingState> timing_;           // the backward in flight
  std::unique_ptr<TimingState> finished_timing_;  // the last finished one
  float backward_end_ms_ = 0;
};

}  // namespace dpt::dist
