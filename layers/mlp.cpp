#include "layers/mlp.h"

#include "core/error.h"
#include "layers/activation.h"
#include "layers/linear.h"

namespace dpt::nn {

MLP::MLP(const std::vector<int64_t>& sizes, const std::string& activation, Generator& gen) {
  DPT_CHECK(sizes.size() >= 2, "MLP: need at least input and output sizes, got {}", sizes.size());
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    push_back(std::make_shared<Linear>(sizes[i], sizes[i + 1], true, gen));
    if (i + 2 < sizes.size()) push_back(make_activation(activation));
  }
}

}  // namespace dpt::nn
