// model.kind mlp: Linear layers (layers/mlp.h) from the data's features to its classes or regression
// outputs, sized by the flat keys model.mlp.* (which predate the registry, so it registers no settings).
#include <spdlog/fmt/fmt.h>

#include "components.h"
#include "layers/flops.h"
#include "layers/mlp.h"
#include "supervised_loss.h"

namespace dpt::train {
namespace {

// Input width, the hidden widths, then the outputs.
std::vector<int64_t> layer_sizes(const MlpConfig& mlp, const DataShape& shape) {
  std::vector<int64_t> sizes{shape.num_features};
  sizes.insert(sizes.end(), mlp.hidden.begin(), mlp.hidden.end());
  sizes.push_back(shape.num_outputs);
  return sizes;
}

ModelParts make_mlp(const Config& config, const Settings&, const DataShape& shape, Generator& gen) {
  const std::vector<int64_t> sizes = layer_sizes(config.model.mlp, shape);
  ModelParts parts;
  parts.module = std::make_shared<nn::MLP>(sizes, config.model.mlp.activation, gen);
  parts.loss = forward_supervised_loss(shape.regression);
  parts.flops_per_unit = nn::mlp_flops_per_sample(parts.module->num_parameters());
  parts.description = fmt::format("mlp: {} ({})", fmt::join(sizes, " -> "), config.model.mlp.activation);
  return parts;
}

// Per example it keeps each hidden layer's pre-activation and activation, the input, and the output with
// float32 softmax and gradient; backward's gradients double it.
ModelFootprint estimate_mlp(const Config& config, const Settings&, const DataShape& shape, DType compute,
                            const Device&) {
  const double c = static_cast<double>(dtype_size(compute));
  std::vector<double> sizes;
  for (int64_t s : layer_sizes(config.model.mlp, shape)) sizes.push_back(static_cast<double>(s));
  ModelFootprint out;
  double per_example = sizes.front() * c + sizes.back() * (c + 8);
  for (size_t i = 1; i < sizes.size(); ++i) {
    out.parameters += sizes[i - 1] * sizes[i] + sizes[i];
    if (i + 1 < sizes.size()) per_example += 2 * sizes[i] * c;
  }
  out.activations = 2 * static_cast<double>(config.training.batch_size) * per_example;
  out.keys = fmt::format("model.mlp.hidden [{}], input width {}, training.batch_size {}",
                         fmt::join(config.model.mlp.hidden, ", "), shape.num_features, config.training.batch_size);
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::models, {"mlp",
                                  "a multilayer perceptron on feature (or flattened image) data (model.mlp.*)",
                                  {},
                                  {dpt::train::make_mlp, dpt::train::estimate_mlp}})
