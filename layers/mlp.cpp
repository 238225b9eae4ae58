#include "layers/mlp.h"

#include <typeinfo>

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

Tensor MLP::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < size(); ++i) {
    // Exact types only: a subclass may override forward, and then it must run as written.
    Module& m = (*this)[i];
    auto* linear = typeid(m) == typeid(Linear) ? static_cast<Linear*>(&m) : nullptr;
    Module* next = i + 1 < size() ? &(*this)[i + 1] : nullptr;
    if (linear && next && typeid(*next) == typeid(ReLU)) {
      h = linear->forward_with(h, Activation::Relu);
      ++i;
    } else if (linear && next && typeid(*next) == typeid(GELU)) {
      h = linear->forward_with(h, Activation::Gelu);
      ++i;
    } else {
      h = m.forward(h);
    }
  }
  return h;
}

}  // namespace dpt::nn
