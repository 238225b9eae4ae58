#pragma once
// Gradient buckets: the unit of DDP communication.
//
// Parameters are assigned to buckets in reverse registration order (the order their gradients tend to
// become ready in backward). The first bucket is small (first_cap_bytes, 1 MiB by default) so the
// first AllReduce starts early; later buckets hold up to cap_bytes (25 MiB). A parameter is never split
// across buckets, and parameters of different dtype or device never share one. A parameter larger than
// the cap gets a bucket of its own. (Sharded buckets, sharded_exchange.h, are cut further: there a
// parameter may span buckets.)
//
// Each bucket owns one flat buffer; every parameter's gradient is a view into it (set_grad), so
// backward writes gradients straight into the buffer that is communicated: no copy in or out.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dpt::dist {

struct BucketSpec {
  std::vector<size_t> params;  // indices into the DDP parameter list, in bucket order
};

// Pure assignment, testable without a process group. `order` lists parameter indices in the order
// they should fill buckets (reverse registration order at first; the observed ready order after the
// first iteration).
std::vector<BucketSpec> assign_buckets(const std::vector<Tensor>& params, const std::vector<size_t>& order,
                                       size_t first_cap_bytes, size_t cap_bytes);

struct GradBucket {
  size_t index = 0;                  // its place in launch order
  std::vector<size_t> params;        // indices into the DDP parameter list (sharded: every one overlapping `buffer`)
  std::vector<int64_t> offsets;      // element offset of each parameter's gradient in `buffer` (sharded: may be < 0)
  Tensor buffer;                     // flat, dtype and device of its parameters
  size_t pending = 0;                // gradients not yet final in this backward
  std::shared_ptr<class Work> work;  // the exchange in flight (bucket_exchange.h)
};

}  // namespace dpt::dist
