#pragma once
// DDP's default exchange: each bucket averaged by an asynchronous AllReduce on the process group's
// communication stream (NCCL: ncclAvg; Gloo: pre-scaled, then summed; bucket_exchange.h prepare_average).
// With a comm_dtype other than the gradients' (bf16 compression of float32 gradients), the bucket travels
// in a copy of that dtype and is converted back into the gradients when finished.
#include <memory>
#include <optional>
#include <vector>

#include "distributed/bucket_exchange.h"

namespace dpt::dist {

class AllReduceExchange : public BucketExchange {
 public:
  AllReduceExchange(std::shared_ptr<ProcessGroup> group, std::optional<DType> comm_dtype = std::nullopt);

  BucketLayout lay_out(const NamedTensors& params, const std::vector<BucketSpec>& specs) override;
  void launch(GradBucket& bucket) override;
  void finish(GradBucket& bucket) override;
  std::string name() const override { return backend_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::optional<DType> comm_dtype_;
  std::vector<Tensor> comm_buffers_;  // [bucket] its buffer cast to comm_dtype, when that differs (else undefined)
  const char* backend_ = "gloo";
};

}  // namespace dpt::dist
