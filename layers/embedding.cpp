#include "layers/embedding.h"

#include "core/error.h"
#include "core/ops.h"
#include "layers/init.h"

namespace dpt::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator& gen) {
  DPT_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got {} x {}", num_embeddings, dim);
  weight = register_parameter("weight", Tensor::empty({num_embeddings, dim}));
  init::normal_(weight, gen, 0.0, 1.0);
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

}  // namespace dpt::nn
