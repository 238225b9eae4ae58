// data.kind synthetic_regression: seeded features and noisy targets (data/synthetic.h). It reads the flat
// keys data.* (which predate the registry), so it registers no settings.
#include "components.h"
#include "data/synthetic.h"
#include "held_out.h"

namespace dpt::train {
namespace {

DataBundle make_synthetic_regression(const Config& c, const Settings&) {
  const DataConfig& d = c.data;
  const int64_t v = held_out(d.num_samples, d.val_fraction);
  data::RegressionOptions o;
  o.num_samples = d.num_samples + v;
  o.num_features = d.num_features;
  o.num_outputs = d.num_outputs;
  o.noise = d.noise;
  o.seed = static_cast<uint64_t>(c.training.seed);
  DataBundle out;
  split_generated(data::make_synthetic_regression(o), d.num_samples, v, "synthetic regression", out);
  out.shape.regression = true;
  out.shape.num_features = d.num_features;
  out.shape.num_outputs = d.num_outputs;
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::datasets, {"synthetic_regression",
                                    "seeded Gaussian features with linear targets plus noise",
                                    {},
                                    {"features", dpt::train::make_synthetic_regression}})
