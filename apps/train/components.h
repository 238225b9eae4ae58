#pragma once
// The trainer's registries (core/registry.h): every optimizer, learning-rate schedule, dataset and model
// that optim.kind, schedule.kind, data.kind and model.kind can name. A component is one source file in the
// matching folder (apps/train/optimizers/, schedules/, datasets/, models/) that DPT_REGISTERs an entry: its
// name joins the kind's allowed values, its settings become the config keys "<section>.<name>.<setting>"
// (optim.lion.beta2), validated and listed by --config-reference like any other key, and its factory is
// what the trainer calls when the config names it. The built-in components predate the registry and read
// the older flat keys (optim.beta1, data.path, model.gpt.n_layer, ...), so they register no settings.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/registry.h"
#include "data_factory.h"
#include "layers/module.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace dpt::train {

// A component's settings as the config set them (defaults for the rest); already validated, so the
// getters only throw for a name the component did not register.
class Settings {
 public:
  Settings(const Config& config, std::string prefix, const std::vector<SettingSpec>& specs);
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  bool flag(const std::string& name) const;
  std::string text(const std::string& name) const;  // String and Choice

 private:
  std::string key(const std::string& name, SettingSpec::Type type) const;
  const Config& config_;
  std::string prefix_;
  const std::vector<SettingSpec>& specs_;
};

// An optimizer over `groups` (the model's, or a ZeRO shard's); optim.lr and optim.weight_decay (already in
// the groups) apply to every optimizer.
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(const Config&, const Settings&, std::vector<optim::ParamGroup>)>;
Registry<OptimizerFactory>& optimizers();

// A schedule of optim.lr over `total_steps` optimizer steps.
using ScheduleFactory =
    std::function<std::unique_ptr<optim::LrSchedule>(const Config&, const Settings&, int64_t total_steps)>;
Registry<ScheduleFactory>& schedules();

// A dataset and what it feeds: `form` is "tokens" (next-token batches, for gpt), "images" or "features",
// so the config can check model and data agree before anything is built.
struct DatasetFactory {
  std::string form;
  std::function<DataBundle(const Config&, const Settings&)> make;
};
Registry<DatasetFactory>& datasets();

// A model built for the data: the module, how a batch becomes its loss, and what the log says about it.
using ModelLoss = std::function<Tensor(nn::Module&, const data::Batch&, DType compute)>;
struct ModelParts {
  std::shared_ptr<nn::Module> module;
  ModelLoss loss;
  std::string description;
  double flops_per_unit = 0;  // forward + backward per example; 0: not counted
};
// What training a model will hold, counted from the config before anything is allocated (for the memory
// check, apps/train/memory_estimate.h). In doubles: the configs this check exists for overflow int64 in
// bytes (65536^2 x 12 x 1024 x 16).
struct ModelFootprint {
  double parameters = 0;
  double activations = 0;  // bytes backward keeps for one micro-batch (training.batch_size)
  std::string keys;        // the config keys that set the size, with their values
};
struct ModelFactory {
  std::function<ModelParts(const Config&, const Settings&, const DataShape&, Generator&)> make;
  // Optional: a model without one is not estimated, so the memory check has nothing to refuse it on.
  std::function<ModelFootprint(const Config&, const Settings&, const DataShape&, DType compute, const Device&)>
      estimate{};
};
Registry<ModelFactory>& models();

// For the config schema: every registered setting with its full key, and the registered components a kind
// key ("optim.kind", "model.gpt.ffn", ...) allows, each a name and what it is.
struct RegisteredSetting {
  std::string key;
  SettingSpec spec;
};
std::vector<RegisteredSetting> registered_settings();
struct RegisteredComponent {
  std::string name;
  std::string help;
};
std::vector<RegisteredComponent> registered_components(const std::string& kind_key);
// The form ("tokens", "images", "features") of a registered dataset, or "" when `kind` is not one.
std::string registered_data_form(const std::string& kind);

}  // namespace dpt::train
