// data.kind synthetic_classification: seeded spirals or Gaussian clusters (data/synthetic.h). It reads the
// flat keys data.* (which predate the registry), so it registers no settings.
#include "components.h"
#include "data/synthetic.h"
#include "held_out.h"

namespace dpt::train {
namespace {

DataBundle make_synthetic_classification(const Config& c, const Settings&) {
  const DataConfig& d = c.data;
  const int64_t v = held_out(d.num_samples, d.val_fraction);
  data::ClassificationOptions o;
  o.num_samples = d.num_samples + v;
  o.num_features = d.num_features;
  o.num_classes = d.num_classes;
  o.kind = d.pattern;
  o.noise = d.noise;
  o.seed = static_cast<uint64_t>(c.training.seed);
  DataBundle out;
  split_generated(data::make_synthetic_classification(o), d.num_samples, v, "synthetic " + d.pattern, out);
  out.shape.num_features = d.num_features;
  out.shape.num_outputs = d.num_classes;
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::datasets, {"synthetic_classification",
                                    "seeded points in classes: spirals or Gaussian clusters (data.pattern)",
                                    {},
                                    {"features", dpt::train::make_synthetic_classification}})
