// data.kind mnist: images and labels from idx files (data/idx_file.h), flattened for an MLP. It reads the
// flat keys data.* (which predate the registry), so it registers no settings.
#include <algorithm>

#include "components.h"
#include "data/idx_file.h"
#include "held_out.h"

namespace dpt::train {
namespace {

// Validation from data.val_path and data.val_labels_path, or else the last data.val_fraction of the
// training files (at least one image stays for training).
DataBundle make_mnist(const Config& c, const Settings&) {
  const DataConfig& d = c.data;
  const bool flatten = c.model.kind == "mlp";
  auto train = data::make_mnist_dataset(d.path, d.labels_path, flatten, d.num_classes);
  DataBundle out;
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
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::datasets,
             {"mnist", "MNIST-style idx files of images and labels", {}, {"images", dpt::train::make_mnist}})
