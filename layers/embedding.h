#pragma once
// Embedding: integer indices [...] -> rows of weight [num_embeddings, dim], giving [..., dim].
#include "layers/module.h"

namespace dpt::nn {

class Embedding : public Module {
 public:
  // weight ~ N(0, 1), PyTorch's default.
  Embedding(int64_t num_embeddings, int64_t dim, Generator& gen = default_generator());
  Tensor forward(const Tensor& indices) override;

  Tensor weight;
};

}  // namespace dpt::nn
