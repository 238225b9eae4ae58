// model.kind softmax_regression: one Linear layer from the features to the classes (or to the regression
// outputs), the baseline a deeper model has to beat. Optionally the inputs are standardised by a fixed
// scale first (features far from unit range make a single layer slow to fit).
#include <spdlog/fmt/fmt.h>

#include "components.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/flops.h"
#include "layers/linear.h"
#include "supervised_loss.h"

namespace dpt::train {
namespace {

ModelParts make_softmax_regression(const Config&, const Settings& s, const DataShape& shape, Generator& gen) {
  DPT_CHECK(!shape.tokens, "model.kind softmax_regression: needs feature or image data, got token data");
  const double scale = s.number("input_scale");
  ModelParts parts;
  parts.module = std::make_shared<nn::Linear>(shape.num_features, shape.num_outputs, s.flag("bias"), gen);
  const bool regression = shape.regression;
  parts.loss = [scale, regression](nn::Module& m, const data::Batch& batch, DType compute) {
    // Images arrive as [B, C, H, W]: one row of features per example.
    Tensor x = reshape(batch.input.to(compute), {batch.input.size(0), -1});
    return supervised_loss(m.forward(scale == 1.0 ? x : mul(x, scale)), batch.target, regression);
  };
  parts.description = fmt::format("softmax_regression: {} -> {}", shape.num_features, shape.num_outputs);
  parts.flops_per_unit = nn::mlp_flops_per_sample(parts.module->num_parameters());
  return parts;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::models, {"softmax_regression",
                                  "a single Linear layer from the features to the outputs (a baseline)",
                                  {{.name = "bias",
                                    .type = dpt::SettingSpec::Type::Bool,
                                    .default_value = "true",
                                    .help = "softmax_regression: a bias per output"},
                                   {.name = "input_scale",
                                    .type = dpt::SettingSpec::Type::Float,
                                    .default_value = "1",
                                    .min = 0,
                                    .max = 1e6,
                                    .help = "softmax_regression: inputs are multiplied by this before the layer"}},
                                  {dpt::train::make_softmax_regression}})
