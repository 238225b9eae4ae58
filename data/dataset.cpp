#include "data/dataset.h"

#include "core/error.h"

namespace dpt::data {

void Dataset::check_indices(const std::vector<int64_t>& indices) const {
  const int64_t n = size();
  for (int64_t index : indices) {
    DPT_CHECK(index >= 0 && index < n, "{}: index {} is outside [0, {})", describe(), index, n);
  }
}

}  // namespace dpt::data
