// data.kind synthetic_images: seeded images, one random template per class, example i = template[i %
// classes] + noise; flattened for an MLP. It reads the flat keys data.* (which predate the registry), so it
// registers no settings.
#include "components.h"
#include "core/error.h"
#include "core/factory.h"
#include "data/counter_random.h"
#include "held_out.h"

namespace dpt::train {
namespace {

// Independent streams of the synthetic images (see data/counter_random.h).
constexpr uint64_t kStreamTemplates = 201;
constexpr uint64_t kStreamPixelNoise = 202;

// Example i is a pure function of (seed, i). Inputs float32 [N, C, S, S], targets int32 [N].
std::shared_ptr<data::TensorDataset> synthetic_images(int64_t num_samples, int64_t channels, int64_t size,
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

DataBundle make_synthetic_images(const Config& c, const Settings&) {
  const DataConfig& d = c.data;
  const int64_t v = held_out(d.num_samples, d.val_fraction);
  auto all = synthetic_images(d.num_samples + v, d.image_channels, d.image_size, d.num_classes, d.noise,
                              static_cast<uint64_t>(c.training.seed));
  const bool flatten = c.model.kind == "mlp";
  if (flatten) {  // an MLP sees the pixels as one flat vector
    all = std::make_shared<data::TensorDataset>(all->inputs().reshape({all->size(), -1}), all->targets(),
                                                "synthetic images (flat)");
  }
  DataBundle out;
  split_generated(all, d.num_samples, v, "synthetic images", out);
  out.shape.images = !flatten;
  out.shape.channels = d.image_channels;
  out.shape.height = out.shape.width = d.image_size;
  out.shape.num_features = d.image_channels * d.image_size * d.image_size;
  out.shape.num_outputs = d.num_classes;
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::datasets, {"synthetic_images",
                                    "seeded images: a random template per class plus noise (data.image_*)",
                                    {},
                                    {"images", dpt::train::make_synthetic_images}})
