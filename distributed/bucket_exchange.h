#pragma once
// What happens to a bucket of gradients once it is ready: the one extension point of
// DistributedDataParallel (ddp.h), like PyTorch DDP's communication hooks (GradBucket -> future) and
// flashlight's Reducer. DDP owns the buckets, the grad-ready hooks and the launch order (index order on
// every rank, the layout rebuilt after the first iteration, nothing inside no_sync); an exchange decides
// how the buckets are laid out in memory, which collective moves a ready bucket, and what is done with the
// result. Implementations: AllReduceExchange (the default; comm_dtype compression), ShardedExchange
// (ZeRO-1's reduce-scatters, NCCL or copy engines) and UpdatingExchange (an optimizer update behind
// either: optimizer in backward, ZeRO-1).
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "core/tensor.h"
#include "distributed/grad_bucket.h"
#include "layers/module.h"

namespace dpt::dist {

// The buckets and, for every parameter, its gradient: a view into the buckets, in the parameter's shape.
struct BucketLayout {
  std::vector<GradBucket> buckets;
  std::vector<Tensor> grads;
};

class BucketExchange {
 public:
  virtual ~BucketExchange() = default;

  // The buckets for `params` grouped as `specs` (assign_buckets, grad_bucket.h), in bucket order, each with
  // its index, parameters and offsets set and pending = params.size(). Called by DDP when it builds its
  // layout (construction, the rebuild after the first iteration, set_exchange).
  virtual BucketLayout lay_out(const NamedTensors& params, const std::vector<BucketSpec>& specs) = 0;
  // False when the layout must stay as first laid out (no rebuild in observed ready order).
  virtual bool rebuildable() const { return true; }
  // During backward, once every gradient of `bucket` is final and every bucket before it has launched, on
  // every rank in the same order: starts the bucket's exchange and sets bucket.work.
  virtual void launch(GradBucket& bucket) = 0;
  // At the end of backward, for every bucket in index order: makes the current stream (CUDA) or the host
  // (Gloo) wait for the bucket's exchange, after which bucket.buffer holds its result.
  virtual void finish(GradBucket& bucket) = 0;
  // After the last finish() of a backward.
  virtual void finish_backward() {}
  // What moves the bytes, for logs: "nccl", "gloo", "nccl (copy engines)".
  virtual std::string name() const = 0;
};

// One zeroed buffer per bucket, each parameter's gradient a contiguous slice of it in bucket order.
BucketLayout contiguous_layout(const NamedTensors& params, const std::vector<BucketSpec>& specs);

// The reduce op that averages `buffer` across `world` ranks. NCCL (CUDA): ncclAvg scales by 1/world inside
// the reduction kernel, so the bucket is not read and written once more on the compute stream. Gloo: the
// buffer is pre-scaled by 1/world here, then summed. Both are exact for power-of-two worlds and keep bf16
// sums in range.
ReduceOp prepare_average(const Tensor& buffer, int world);

// "nccl" for CUDA tensors, "gloo" otherwise.
const char* backend_of(const Tensor& buffer);

}  // namespace dpt::dist
