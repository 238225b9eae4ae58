#include "held_out.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dpt::train {

namespace {

// Rows [begin, end) of a tensor dataset, as a dataset of its own.
std::shared_ptr<data::TensorDataset> rows(const data::TensorDataset& source, int64_t begin, int64_t end,
                                          const std::string& name) {
  std::vector<int64_t> indices(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) indices[static_cast<size_t>(i - begin)] = i;
  return std::make_shared<data::TensorDataset>(data::gather_rows(source.inputs(), indices),
                                               data::gather_rows(source.targets(), indices), name);
}

}  // namespace

int64_t held_out(int64_t n, double fraction) {
  if (fraction <= 0) return 0;
  return std::max<int64_t>(1, std::llround(static_cast<double>(n) * fraction));
}

void split_generated(const std::shared_ptr<data::TensorDataset>& all, int64_t n, int64_t v, const std::string& name,
                     DataBundle& out) {
  if (v == 0) {
    out.train = all;
    return;
  }
  out.train = rows(*all, 0, n, name);
  out.val = rows(*all, n, n + v, name + " (validation)");
}

uint64_t validation_seed(uint64_t seed) { return seed ^ 0x9e3779b97f4a7c15ull; }

}  // namespace dpt::train
