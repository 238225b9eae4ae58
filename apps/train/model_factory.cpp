#include "model_factory.h"

#include <utility>

#include <spdlog/fmt/fmt.h>

#include "components.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/activation.h"
#include "layers/conv.h"
#include "layers/flops.h"
#include "layers/gpt.h"
#include "layers/linear.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "layers/sequential.h"

namespace dpt::train {

namespace {

std::string millions(int64_t n) {
  const auto x = static_cast<double>(n);
  return x >= 1e6 ? fmt::format("{:.2f}M parameters", x / 1e6) : fmt::format("{:.1f}k parameters", x / 1e3);
}

// [conv(k, same padding) -> ReLU -> 2x2 max-pool] per entry of `channels`, then flatten ->
// Linear(hidden) -> ReLU -> Linear(classes). Children numbered like a torch.nn.Sequential.
std::shared_ptr<nn::Module> make_cnn(const CnnConfig& cfg, const DataShape& shape, Generator& gen) {
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

}  // namespace

Model::Model(const Config& config, const DataShape& shape, Generator& gen) : kind_(config.model.kind) {
  regression_ = shape.regression;
  if (const auto* entry = models().find(kind_)) {
    // A registered model (apps/train/models/).
    ModelParts parts = entry->make(config, Settings(config, "model." + kind_, entry->settings), shape, gen);
    DPT_CHECK(parts.module != nullptr && parts.loss, "model.kind {}: its factory returned no module or no loss", kind_);
    module_ = std::move(parts.module);
    registered_loss_ = std::move(parts.loss);
    flops_per_unit_ = parts.flops_per_unit;
    description_ = fmt::format("{} ({})", parts.description, millions(module_->num_parameters()));
  } else if (kind_ == "gpt") {
    const GptConfig& g = config.model.gpt;
    nn::GPTConfig gc;
    gc.vocab_size = g.vocab_size > 0 ? g.vocab_size : shape.vocab_size;
    DPT_CHECK(gc.vocab_size >= shape.vocab_size,
              "model.gpt.vocab_size: the data holds token ids up to {}, so at least {} is needed, got {}",
              shape.vocab_size - 1, shape.vocab_size, gc.vocab_size);
    gc.block_size = g.block_size > 0 ? g.block_size : shape.seq_len;
    gc.n_layer = g.n_layer;
    gc.n_head = g.n_head;
    gc.n_embd = g.n_embd;
    gc.dropout = g.dropout;
    gc.bias = g.bias;
    gc.ffn = g.ffn;
    seq_len_ = shape.seq_len;
    module_ = std::make_shared<nn::GPT>(gc, gen);
    flops_per_unit_ =
        nn::gpt_flops_per_token(module_->num_parameters(), gc.n_layer, gc.n_embd, shape.seq_len, gc.block_size);
    description_ = fmt::format("gpt: {} layers, {} heads, width {}, vocab {}, context {}{}{}{} ({})", gc.n_layer,
                               gc.n_head, gc.n_embd, gc.vocab_size, gc.block_size, gc.bias ? "" : ", no biases",
                               gc.ffn == "mlp" ? "" : ", " + gc.ffn + " feed-forward",
                               gc.dropout > 0 ? fmt::format(", dropout {:g}", gc.dropout) : "",
                               millions(module_->num_parameters()));
  } else if (kind_ == "mlp") {
    std::vector<int64_t> sizes{shape.num_features};
    sizes.insert(sizes.end(), config.model.mlp.hidden.begin(), config.model.mlp.hidden.end());
    sizes.push_back(shape.num_outputs);
    module_ = std::make_shared<nn::MLP>(sizes, config.model.mlp.activation, gen);
    flops_per_unit_ = nn::mlp_flops_per_sample(module_->num_parameters());
    description_ = fmt::format("mlp: {} ({}) ({})", fmt::join(sizes, " -> "), config.model.mlp.activation,
                               millions(module_->num_parameters()));
  } else if (kind_ == "cnn") {
    module_ = make_cnn(config.model.cnn, shape, gen);
    description_ =
        fmt::format("cnn: {}x{}x{} -> channels [{}], kernel {}, hidden {} -> {} classes ({})", shape.channels,
                    shape.height, shape.width, fmt::join(config.model.cnn.channels, ", "), config.model.cnn.kernel_size,
                    config.model.cnn.hidden, shape.num_outputs, millions(module_->num_parameters()));
  } else {
    DPT_FAIL("model.kind: expected mlp | gpt | cnn, got '{}'", kind_);
  }
}

Tensor Model::loss(const data::Batch& batch, DType compute) const {
  if (registered_loss_) return registered_loss_(*module_, batch, compute);
  if (is_gpt()) return static_cast<nn::GPT&>(*module_).loss(batch.input, batch.target);
  Tensor out = module_->forward(batch.input.to(compute));
  if (regression_) return nn::mse(out.to(DType::Float32), batch.target);
  return nn::cross_entropy_loss(std::move(out), batch.target);
}

Model::Scored Model::score(const data::Batch& batch, DType compute) const {
  DPT_CHECK(is_classifier(), "Model::score: a {} model is not a classifier", kind_);
  Tensor out = module_->forward(batch.input.to(compute));
  const std::vector<int64_t> predicted = argmax(out, 1).to_vector<int64_t>();
  const std::vector<int64_t> labels = batch.target.to_vector<int64_t>();
  Scored s;
  for (size_t i = 0; i < predicted.size(); ++i) s.correct += predicted[i] == labels[i] ? 1 : 0;
  s.loss = nn::cross_entropy_loss(std::move(out), batch.target);
  return s;
}

}  // namespace dpt::train
