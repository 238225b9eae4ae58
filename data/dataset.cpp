#include "data/dataset.h"

#include "core/error.h"

namespace dpt::data {

void Dataset::check_indices(const std::vector<int64_t>& indices) const {
  const int64_t n = size();
  for (int64_t index : indices) {
    DPT_CHECK(index >= 0 && index < n, "{}: index {} is outside [0, {})", describe(), index, n);
  }
}

Batch Dataset::get_batch(const std::vector<int64_t>& indices, int64_t epoch) const {
  check_indices(indices);
  DPT_CHECK(epoch >= 0, "{}: epoch {} is negative", describe(), epoch);
  return gather(indices, epoch);
}

}  // namespace dpt::data
