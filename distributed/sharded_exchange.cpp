#include "distributed/sharded_exchange.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"
#ifdef DPT_HAVE_CUDA
#include "core/cuda/stream.h"
#include "distributed/block_average.h"
#endif

namespace dpt::dist {

ShardedExchange::ShardedExchange(std::shared_ptr<ProcessGroup> group, size_t cap_bytes, bool copy_engines)
    : group_(std::move(group)), cap_bytes_(cap_bytes), copy_engines_(copy_engines) {}

std::string ShardedExchange::name() const { return ce_group_ ? "nccl (copy engines)" : backend_; }

BucketLayout ShardedExchange::lay_out(const NamedTensors& params, const std::vector<BucketSpec>& specs) {
  NoGradGuard no_grad;
  BucketLayout layout;
  layout.grads.resize(params.size());
  param_buffers_.clear();
  received_.clear();
  if (params.empty()) return layout;
  const Tensor& first = params.front().second;
  backend_ = backend_of(first);
  std::vector<int64_t> offset(params.size(), 0);
  // 1. The flat order (specs' order), each gradient's offset in it, and where buckets may end.
  std::vector<size_t> order;
  std::vector<int64_t> cuts;  // before rounding to the world size
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(cap_bytes_ / dtype_size(first.dtype())));
  int64_t total = 0;
  for (const auto& spec : specs) {
    for (size_t i : spec.params) {
      const Tensor& p = params[i].second;
      DPT_CHECK(p.numel() > 0, "ShardedExchange: parameter '{}' has no elements", params[i].first);
      DPT_CHECK(p.dtype() == first.dtype() && p.device() == first.device(),
                "ShardedExchange: parameter '{}' is {} on {}, but '{}' is {} on {}; sharded buckets need one dtype "
                "and device",
                params[i].first, dtype_name(p.dtype()), p.device().str(), params.front().first,
                dtype_name(first.dtype()), first.device().str());
      offset[i] = total;
      for (int64_t part = cap; part < p.numel(); part += cap) cuts.push_back(total + part);
      total += p.numel();
      order.push_back(i);
    }
    cuts.push_back(total);
  }
  // 2. The two flat buffers, the parameters moved into theirs. Copy engines: cuts on multiples of 64 elements
  // a rank, so every block starts 16-byte aligned for the averaging kernel; the buffers in symmetric memory.
  const int64_t world = group_->size();
  const bool copy_engines = copy_engines_ && first.device().is_cuda();
  const int64_t granule = copy_engines ? world * 64 : world;
  auto round_up = [granule](int64_t n) { return (n + granule - 1) / granule * granule; };
  const int64_t padded = round_up(total);
#ifdef DPT_HAVE_CUDA
  DPT_CHECK(!copy_engines || world <= kMaxAveragedRanks,
            "DistributedDataParallel: copy_engines averages at most {} ranks (one host's GPUs), the group has {}",
            kMaxAveragedRanks, world);
#endif
  if (copy_engines && !ce_group_) {
    ProcessGroupOptions ce_options = group_->options();
    ce_options.copy_engines = true;
    ce_group_ = group_->duplicate(ce_options);
  }
  auto flat_zeros = [&] {
    return copy_engines ? ce_group_->symmetric_zeros(padded, first.options()) : zeros({padded}, first.options());
  };
  const Tensor grads = flat_zeros();
  params_ = flat_zeros();
  // The all-to-alls' receive buffer: world blocks per bucket, laid out like the gradients.
  const Tensor received = copy_engines ? flat_zeros() : Tensor();
  for (size_t i : order) {
    const Tensor& p = params[i].second;
    Tensor slot = params_.slice(offset[i], offset[i] + p.numel()).reshape(p.shape());
    slot.copy_(p);
    nn::replace_data(p, slot);
    layout.grads[i] = grads.slice(offset[i], offset[i] + p.numel()).reshape(p.shape());
  }
  // 3. Buckets between consecutive cuts, each listing every parameter it overlaps.
  int64_t begin = 0;
  size_t next = 0;  // first parameter (in flat order) that may overlap the next bucket
  for (int64_t cut : cuts) {
    const int64_t end = std::min(round_up(cut), padded);
    if (end <= begin) continue;
    GradBucket bucket;
    bucket.index = layout.buckets.size();
    bucket.buffer = grads.slice(begin, end);
    param_buffers_.push_back(params_.slice(begin, end));
    received_.push_back(copy_engines ? received.slice(begin, end) : Tensor());
    while (next < order.size() && offset[order[next]] + params[order[next]].second.numel() <= begin) ++next;
    for (size_t k = next; k < order.size() && offset[order[k]] < end; ++k) {
      bucket.params.push_back(order[k]);
      bucket.offsets.push_back(offset[order[k]] - begin);  // negative for a parameter begun in an earlier bucket
    }
    bucket.pending = bucket.params.size();
    layout.buckets.push_back(std::move(bucket));
    begin = end;
  }
  return layout;
}

void ShardedExchange::launch(GradBucket& bucket) {
  NoGradGuard no_grad;
  const ReduceOp op = prepare_average(bucket.buffer, group_->size());
  const Tensor& payload = bucket.buffer;
  if (const Tensor& received = received_[bucket.index]; received.defined()) {
    // Every rank's block r lands in rank r's receive buffer; finish() averages them after `work`.
    bucket.work = ce_group_->alltoall(received, payload);
    return;
  }
  // In place: this rank's block of the bucket receives the average of every rank's block (NCCL and our
  // Gloo backend both accept the output inside the input at offset rank * block).
  const int64_t block = payload.numel() / group_->size();
  const int64_t mine = group_->rank() * block;
  bucket.work = group_->reduce_scatter(payload.slice(mine, mine + block), payload, op);
}

void ShardedExchange::finish(GradBucket& bucket) {
  bucket.work->wait();
  average_received(bucket);
}

// On the stream that just waited for the bucket's all-to-all: this rank's block of the bucket becomes the
// mean of every rank's copy of it, summed in rank order in float32 (the same on every rank, and for two
// ranks the correctly rounded mean, as ncclAvg gives).
void ShardedExchange::average_received(GradBucket& bucket) {
  const Tensor& received = received_[bucket.index];
  if (!received.defined()) return;
#ifdef DPT_HAVE_CUDA
  const int world = group_->size();
  const int64_t block = bucket.buffer.numel() / world;
  const size_t bytes = static_cast<size_t>(block) * dtype_size(bucket.buffer.dtype());
  std::vector<const void*> copies;
  for (int r = 0; r < world; ++r) copies.push_back(static_cast<const char*>(received.data_ptr()) + r * bytes);
  void* mine = static_cast<char*>(bucket.buffer.data_ptr()) + group_->rank() * bytes;
  block_average(mine, copies, block, bucket.buffer.dtype(), cuda::current_stream(bucket.buffer.device().index));
#endif
}

}  // namespace dpt::dist
