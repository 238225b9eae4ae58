#include "data_factory.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "components.h"
#include "core/error.h"
#include "core/factory.h"
#include "data/counter_random.h"
#include "data/idx_file.h"
#include "data/synthetic.h"
#include "data/tensor_dataset.h"
#include "data/token_file.h"
#include "data/token_windows.h"

namespace dpt::train {

namespace {

// Independent streams of the synthetic images (see data/counter_random.h).
constexpr uint64_t kStreamTemplates = 201;
constexpr uint64_t kStreamPixelNoise = 202;

// Rows [begin, end) of a tensor dataset, as a dataset of its own.
std::shared_ptr<data::TensorDataset> rows(const data::TensorDataset& source, int64_t begin, int64_t end,
                                          const std::string& name) {
  std::vector<int64_t> indices(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) indices[static_cast<size_t>(i - begin)] = i;
  return std::make_shared<data::TensorDataset>(data::gather_rows(source.inputs(), indices),
                                               data::gather_rows(source.targets(), indices), name);
}

// Examples held out for evaluation from `n` generated ones: round(n * fraction), at least one when
// the fraction is positive.
int64_t held_out(int64_t n, double fraction) {
  if (fraction <= 0) return 0;
  return std::max<int64_t>(1, std::llround(static_cast<double>(n) * fraction));
}

// Generates n training + v validation examples in one seeded draw and splits them: example i is a pure
// function of (seed, i), so training data do not depend on the validation size.
void split_generated(const std::shared_ptr<data::TensorDataset>& all, int64_t n, int64_t v, const std::string& name,
                     DataBundle& out) {
  if (v == 0) {
    out.train = all;
    return;
  }
  out.train = rows(*all, 0, n, name);
  out.val = rows(*all, n, n + v, name + " (validation)");
}

// Validation windows use the training window mode (nanoGPT evaluates on random windows of the held-out
// tail) from a seed of their own, so they are not the training draws shifted into the tail.
uint64_t validation_seed(uint64_t seed) { return seed ^ 0x9e3779b97f4a7c15ull; }

void make_token_data(const Config& c, DataBundle& out) {
  const DataConfig& d = c.data;
  const data::WindowMode mode = data::parse_window_mode(d.window);
  const auto seed = static_cast<uint64_t>(c.training.seed);
  out.shape.tokens = true;
  out.shape.seq_len = d.seq_len;
  if (d.kind == "text") {
    // The training range is the head of the file, validation the tail; one vocabulary for both.
    const double split = 1.0 - d.val_fraction;
    auto train = std::make_shared<data::CharTextDataset>(d.path, d.seq_len, mode, seed, data::Range{0.0, split});
    out.shape.vocab_size = train->vocab().size();
    out.vocab = train->vocab();
    if (d.val_fraction > 0) {
      out.val = std::make_shared<data::CharTextDataset>(d.path, d.seq_len, mode, validation_seed(seed),
                                                        data::Range{split, 1.0});
    }
    out.train = train;
    return;
  }
  if (d.kind == "synthetic_tokens") {
    // Every rank may generate the file: each writes a private temp file and renames it into place. A
    // file the generator did not write is refused, never overwritten.
    try {
      data::ensure_synthetic_token_file(d.path, d.num_tokens, d.vocab_size, seed);
    } catch (const Error& e) {
      DPT_FAIL("data.path (data.kind synthetic_tokens): {}", e.what());
    }
  }
  const bool separate_val = !d.val_path.empty();
  const double split = separate_val ? 1.0 : 1.0 - d.val_fraction;
  auto train = std::make_shared<data::TokenFileDataset>(d.path, d.seq_len, mode, seed, data::Range{0.0, split});
  int64_t max_token = train->max_token();
  std::shared_ptr<data::TokenFileDataset> val;
  if (separate_val) {
    val = std::make_shared<data::TokenFileDataset>(d.val_path, d.seq_len, mode, validation_seed(seed));
  } else if (d.val_fraction > 0) {
    val = std::make_shared<data::TokenFileDataset>(d.path, d.seq_len, mode, validation_seed(seed),
                                                   data::Range{split, 1.0});
  }
  if (val) max_token = std::max(max_token, val->max_token());
  out.shape.vocab_size = d.kind == "synthetic_tokens" ? d.vocab_size : max_token + 1;
  out.train = train;
  out.val = val;
}

void make_mnist_data(const Config& c, DataBundle& out) {
  const DataConfig& d = c.data;
  const bool flatten = c.model.kind == "mlp";
  auto train = data::make_mnist_dataset(d.path, d.labels_path, flatten, d.num_classes);
  if (!d.val_path.empty()) {
    out.train = train;
    out.val = data::make_mnist_dataset(d.val_path, d.val_labels_path, flatten, d.num_classes);
  } else {
    const int64_t total = train->size();
    const int64_t v = std::min(held_out(total, d.val_fraction), total - 1);
    split_generated(train, total - v, v, "mnist", out);
  }
  const Tensor& x = train->inputs();
  out.shape.images = !flatten;
  out.shape.num_outputs = d.num_classes;
  out.shape.num_features = x.numel() / x.size(0);
  if (!flatten) {
    out.shape.channels = x.size(1);
    out.shape.height = x.size(2);
    out.shape.width = x.size(3);
  }
}

}  // namespace

std::shared_ptr<data::Dataset> make_synthetic_images(int64_t num_samples, int64_t channels, int64_t size,
                                                     int64_t num_classes, double noise, uint64_t seed) {
  DPT_CHECK(num_samples > 0 && channels > 0 && size > 0 && num_classes >= 2,
            "synthetic images: need positive samples/channels/size and >= 2 classes, got {}/{}/{}/{}", num_samples,
            channels, size, num_classes);
  const int64_t pixels = channels * size * size;
  std::vector<float> x(static_cast<size_t>(num_samples * pixels));
  std::vector<int32_t> y(static_cast<size_t>(num_samples));
  for (int64_t i = 0; i < num_samples; ++i) {
    const int64_t label = i % num_classes;
    y[static_cast<size_t>(i)] = static_cast<int32_t>(label);
    for (int64_t p = 0; p < pixels; ++p) {
      const double base = data::random::normal(seed, kStreamTemplates, static_cast<uint64_t>(label * pixels + p));
      const double jitter = data::random::normal(seed, kStreamPixelNoise, static_cast<uint64_t>(i * pixels + p));
      x[static_cast<size_t>(i * pixels + p)] = static_cast<float>(base + noise * jitter);
    }
  }
  return std::make_shared<data::TensorDataset>(from_vector(x, {num_samples, channels, size, size}),
                                               from_vector(y, {num_samples}, TensorOptions{}.with_dtype(DType::Int32)),
                                               "synthetic images");
}

DataBundle make_data(const Config& c) {
  const DataConfig& d = c.data;
  // A registered dataset (apps/train/datasets/) builds itself.
  if (const auto* entry = datasets().find(d.kind)) {
    return entry->make.make(c, Settings(c, "data." + d.kind, entry->settings));
  }
  const auto seed = static_cast<uint64_t>(c.training.seed);
  DataBundle out;
  if (d.kind == "tokens" || d.kind == "text" || d.kind == "synthetic_tokens") {
    make_token_data(c, out);
  } else if (d.kind == "mnist") {
    make_mnist_data(c, out);
  } else if (d.kind == "synthetic_classification") {
    const int64_t v = held_out(d.num_samples, d.val_fraction);
    data::ClassificationOptions o;
    o.num_samples = d.num_samples + v;
    o.num_features = d.num_features;
    o.num_classes = d.num_classes;
    o.kind = d.pattern;
    o.noise = d.noise;
    o.seed = seed;
    split_generated(data::make_synthetic_classification(o), d.num_samples, v, "synthetic " + d.pattern, out);
    out.shape.num_features = d.num_features;
    out.shape.num_outputs = d.num_classes;
  } else if (d.kind == "synthetic_regression") {
    const int64_t v = held_out(d.num_samples, d.val_fraction);
    data::RegressionOptions o;
    o.num_samples = d.num_samples + v;
    o.num_features = d.num_features;
    o.num_outputs = d.num_outputs;
    o.noise = d.noise;
    o.seed = seed;
    split_generated(data::make_synthetic_regression(o), d.num_samples, v, "synthetic regression", out);
    out.shape.regression = true;
    out.shape.num_features = d.num_features;
    out.shape.num_outputs = d.num_outputs;
  } else if (d.kind == "synthetic_images") {
    const int64_t v = held_out(d.num_samples, d.val_fraction);
    auto all = std::static_pointer_cast<data::TensorDataset>(
        make_synthetic_images(d.num_samples + v, d.image_channels, d.image_size, d.num_classes, d.noise, seed));
    if (c.model.kind == "mlp") {  // an MLP sees the pixels as one flat vector
      all = std::make_shared<data::TensorDataset>(all->inputs().reshape({all->size(), -1}), all->targets(),
                                                  "synthetic images (flat)");
    }
    split_generated(all, d.num_samples, v, "synthetic images", out);
    out.shape.images = c.model.kind != "mlp";
    out.shape.channels = d.image_channels;
    out.shape.height = out.shape.width = d.image_size;
    out.shape.num_features = d.image_channels * d.image_size * d.image_size;
    out.shape.num_outputs = d.num_classes;
  } else {
    DPT_FAIL("data.kind '{}' is not supported by the trainer", d.kind);
  }
  return out;
}

}  // namespace dpt::train
