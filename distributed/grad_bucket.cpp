#include "distributed/grad_bucket.h"

#include <map>
#include <tuple>

namespace dpt::dist {

std::vector<BucketSpec> assign_buckets(const std::vector<Tensor>& params, const std::vector<size_t>& order,
                                       size_t first_cap_bytes, size_t cap_bytes) {
  // One open bucket per (dtype, device); a bucket closes when the next parameter would overflow it.
  using Key = std::tuple<int, int, int>;
  struct Open {
    BucketSpec spec;
    size_t bytes = 0;
  };
  std::map<Key, Open> open;
  std::vector<BucketSpec> done;
  size_t cap = first_cap_bytes;
  for (size_t index : order) {
    const Tensor& p = params[index];
    Key key{static_cast<int>(p.dtype()), static_cast<int>(p.device().kind), p.device().index};
    Open& bucket = open[key];
    size_t bytes = p.nbytes();
    if (!bucket.spec.params.empty() && bucket.bytes + bytes > cap) {
      done.push_back(std::move(bucket.spec));
      bucket = Open{};
      cap = cap_bytes;  // only the very first bucket is the small one
    }
    bucket.spec.params.push_back(index);
    bucket.bytes += bytes;
    if (bucket.bytes >= cap) {
      done.push_back(std::move(bucket.spec));
      bucket = Open{};
      cap = cap_bytes;
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.spec.params.empty()) done.push_back(std::move(bucket.spec));
  }
  return done;
}

}  // namespace dpt::dist
