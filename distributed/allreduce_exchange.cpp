#include "distributed/allreduce_exchange.h"

#include "core/autograd.h"
#include "core/factory.h"

namespace dpt::dist {

AllReduceExchange::AllReduceExchange(std::shared_ptr<ProcessGroup> group, std::optional<DType> comm_dtype)
    : group_(std::move(group)), comm_dtype_(comm_dtype) {}

BucketLayout AllReduceExchange::lay_out(const NamedTensors& params, const std::vector<BucketSpec>& specs) {
  BucketLayout layout = contiguous_layout(params, specs);
  comm_buffers_.assign(layout.buckets.size(), Tensor());
  for (const GradBucket& bucket : layout.buckets) {
    const Tensor& buffer = bucket.buffer;
    backend_ = backend_of(buffer);
    if (comm_dtype_ && *comm_dtype_ != buffer.dtype())
      comm_buffers_[bucket.index] = zeros({buffer.numel()}, buffer.options().with_dtype(*comm_dtype_));
  }
  return layout;
}

void AllReduceExchange::launch(GradBucket& bucket) {
  NoGradGuard no_grad;
  const ReduceOp op = prepare_average(bucket.buffer, group_->size());
  Tensor payload = bucket.buffer;
  if (Tensor& comm = comm_buffers_[bucket.index]; comm.defined()) {
    comm.copy_(bucket.buffer);
    payload = comm;
  }
  bucket.work = group_->allreduce(payload, op);
}

void AllReduceExchange::finish(GradBucket& bucket) {
  NoGradGuard no_grad;
  bucket.work->wait();
  if (const Tensor& comm = comm_buffers_[bucket.index]; comm.defined()) bucket.buffer.copy_(comm);
}

}  // namespace dpt::dist
