#include "distributed/bucket_exchange.h"

#include "core/autograd.h"
#include "core/factory.h"
#include "core/kernels.h"

namespace dpt::dist {

BucketLayout contiguous_layout(const NamedTensors& params, const std::vector<BucketSpec>& specs) {
  NoGradGuard no_grad;
  BucketLayout layout;
  layout.grads.resize(params.size());
  for (size_t b = 0; b < specs.size(); ++b) {
    GradBucket bucket;
    bucket.index = b;
    bucket.params = specs[b].params;
    int64_t total = 0;
    for (size_t i : bucket.params) {
      bucket.offsets.push_back(total);
      total += params[i].second.numel();
    }
    bucket.buffer = zeros({total}, params[bucket.params.front()].second.options());
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const Tensor& p = params[bucket.params[j]].second;
      layout.grads[bucket.params[j]] =
          bucket.buffer.slice(bucket.offsets[j], bucket.offsets[j] + p.numel()).reshape(p.shape());
    }
    bucket.pending = bucket.params.size();
    layout.buckets.push_back(std::move(bucket));
  }
  return layout;
}

ReduceOp prepare_average(const Tensor& buffer, int world) {
  if (buffer.device().is_cuda()) return ReduceOp::Avg;
  kernels::unary(kernels::UnaryOp::Scale, buffer, buffer, 1.0 / world);
  return ReduceOp::Sum;
}

const char* backend_of(const Tensor& buffer) { return buffer.device().is_cuda() ? "nccl" : "gloo"; }

}  // namespace dpt::dist
