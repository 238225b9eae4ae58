// model.kind cnn: a small convolutional classifier on image data, sized by the flat keys model.cnn.*
// (which predate the registry, so it registers no settings). FLOPs are not counted.
#include <spdlog/fmt/fmt.h>

#include "components.h"
#include "core/error.h"
#include "layers/activation.h"
#include "layers/conv.h"
#include "layers/linear.h"
#include "layers/sequential.h"
#include "supervised_loss.h"

namespace dpt::train {
namespace {

// [conv(k, same padding) -> ReLU -> 2x2 max-pool] per entry of `channels`, then flatten ->
// Linear(hidden) -> ReLU -> Linear(classes). Children numbered like a torch.nn.Sequential.
std::shared_ptr<nn::Module> cnn_module(const CnnConfig& cfg, const DataShape& shape, Generator& gen) {
  const int64_t stages = static_cast<int64_t>(cfg.channels.size());
  const int64_t shrink = int64_t{1} << stages;
  DPT_CHECK(shape.height % shrink == 0 && shape.width % shrink == 0,
            "model.cnn.channels: {} pooling stages need image sides divisible by {}, got {}x{} (data.image_size)",
            stages, shrink, shape.height, shape.width);
  auto net = std::make_shared<nn::Sequential>();
  int64_t in = shape.channels;
  for (int64_t out : cfg.channels) {
    net->push_back(std::make_shared<nn::Conv2d>(in, out, cfg.kernel_size, 1, cfg.kernel_size / 2, true, gen));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::MaxPool2d>(2));
    in = out;
  }
  net->push_back(std::make_shared<nn::Flatten>());
  const int64_t flat = in * (shape.height / shrink) * (shape.width / shrink);
  net->push_back(std::make_shared<nn::Linear>(flat, cfg.hidden, true, gen));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(cfg.hidden, shape.num_outputs, true, gen));
  return net;
}

ModelParts make_cnn(const Config& config, const Settings&, const DataShape& shape, Generator& gen) {
  const CnnConfig& cnn = config.model.cnn;
  ModelParts parts;
  parts.module = cnn_module(cnn, shape, gen);
  parts.loss = forward_supervised_loss(shape.regression);
  parts.description =
      fmt::format("cnn: {}x{}x{} -> channels [{}], kernel {}, hidden {} -> {} classes", shape.channels, shape.height,
                  shape.width, fmt::join(cnn.channels, ", "), cnn.kernel_size, cnn.hidden, shape.num_outputs);
  return parts;
}

// Per example each stage keeps the conv and ReLU outputs and the pooled map (2.25 x channels x height x
// width); backward's gradients double it.
ModelFootprint estimate_cnn(const Config& config, const Settings&, const DataShape& shape, DType compute,
                            const Device&) {
  const CnnConfig& cnn = config.model.cnn;
  const double c = static_cast<double>(dtype_size(compute));
  const double k2 = static_cast<double>(cnn.kernel_size * cnn.kernel_size);
  double in = static_cast<double>(shape.channels), area = static_cast<double>(shape.height * shape.width);
  ModelFootprint out;
  double per_example = in * area * c;
  for (int64_t ch : cnn.channels) {
    const double o = static_cast<double>(ch);
    out.parameters += k2 * in * o + o;
    per_example += 2.25 * o * area * c;
    in = o;
    area /= 4;
  }
  const double flat = in * area, hidden = static_cast<double>(cnn.hidden);
  const double classes = static_cast<double>(shape.num_outputs);
  out.parameters += flat * hidden + hidden + hidden * classes + classes;
  per_example += 2 * hidden * c + classes * (c + 8);
  out.activations = 2 * static_cast<double>(config.training.batch_size) * per_example;
  out.keys = fmt::format("model.cnn.channels [{}], model.cnn.hidden {}, images {}x{}x{}, training.batch_size {}",
                         fmt::join(cnn.channels, ", "), cnn.hidden, shape.channels, shape.height, shape.width,
                         config.training.batch_size);
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::models, {"cnn",
                                  "a convolutional classifier on image data (model.cnn.*)",
                                  {},
                                  {dpt::train::make_cnn, dpt::train::estimate_cnn}})
