#include "components.h"

#include <spdlog/fmt/fmt.h>

#include <cstdlib>

#include "core/error.h"
#include "layers/feed_forward.h"

namespace dpt::train {

namespace {

// The kind keys and the section their components' settings live under.
template <class F>
void collect(const char* section, const Registry<F>& registry, std::vector<RegisteredSetting>& out) {
  for (const auto& entry : registry.entries())
    for (const SettingSpec& spec : entry.settings)
      out.push_back({fmt::format("{}.{}.{}", section, entry.name, spec.name), spec});
}

template <class F>
std::vector<RegisteredComponent> components_of(const Registry<F>& registry) {
  std::vector<RegisteredComponent> out;
  for (const auto& entry : registry.entries()) out.push_back({entry.name, entry.help});
  return out;
}

}  // namespace

Registry<OptimizerFactory>& optimizers() {
  static Registry<OptimizerFactory> r;
  return r;
}
Registry<ScheduleFactory>& schedules() {
  static Registry<ScheduleFactory> r;
  return r;
}
Registry<DatasetFactory>& datasets() {
  static Registry<DatasetFactory> r;
  return r;
}
Registry<ModelFactory>& models() {
  static Registry<ModelFactory> r;
  return r;
}

std::vector<RegisteredSetting> registered_settings() {
  std::vector<RegisteredSetting> out;
  collect("model", models(), out);
  collect("data", datasets(), out);
  collect("optim", optimizers(), out);
  collect("schedule", schedules(), out);
  return out;
}

std::vector<RegisteredComponent> registered_components(const std::string& kind_key) {
  if (kind_key == "model.kind") return components_of(models());
  if (kind_key == "data.kind") return components_of(datasets());
  if (kind_key == "optim.kind") return components_of(optimizers());
  if (kind_key == "schedule.kind") return components_of(schedules());
  if (kind_key == "model.gpt.ffn") return components_of(nn::feed_forwards());
  return {};
}

std::string registered_data_form(const std::string& kind) {
  const auto* entry = datasets().find(kind);
  return entry ? entry->make.form : "";
}

// ------------------------------------------------------------------------------------------------

ComponentSettings::ComponentSettings() {
  // Defaults were checked against their own specs when the schema was built (config.cpp), so plain
  // conversions suffice here.
  for (const RegisteredSetting& r : registered_settings()) {
    const std::string& v = r.spec.default_value;
    switch (r.spec.type) {
      case SettingSpec::Type::Int:
        ints[r.key] = std::strtoll(v.c_str(), nullptr, 10);
        break;
      case SettingSpec::Type::Float:
        floats[r.key] = std::strtod(v.c_str(), nullptr);
        break;
      case SettingSpec::Type::Bool:
        bools[r.key] = v == "true";
        break;
      case SettingSpec::Type::String:
      case SettingSpec::Type::Choice:
        strings[r.key] = v;
        break;
    }
  }
}

Settings::Settings(const Config& config, std::string prefix, const std::vector<SettingSpec>& specs)
    : config_(config), prefix_(std::move(prefix)), specs_(specs) {}

std::string Settings::key(const std::string& name, SettingSpec::Type type) const {
  for (const SettingSpec& s : specs_) {
    if (s.name != name) continue;
    const bool text = type == SettingSpec::Type::String || type == SettingSpec::Type::Choice;
    const bool s_text = s.type == SettingSpec::Type::String || s.type == SettingSpec::Type::Choice;
    DPT_CHECK(s.type == type || (text && s_text), "{}.{}: read as another type than it was registered with", prefix_,
              name);
    return prefix_ + "." + name;
  }
  std::vector<std::string> names;
  for (const SettingSpec& s : specs_) names.push_back(s.name);
  DPT_FAIL("{}.{}: no such setting is registered (registered: {})", prefix_, name, fmt::join(names, ", "));
}

int64_t Settings::integer(const std::string& name) const {
  return config_.components.ints.at(key(name, SettingSpec::Type::Int));
}
double Settings::number(const std::string& name) const {
  return config_.components.floats.at(key(name, SettingSpec::Type::Float));
}
bool Settings::flag(const std::string& name) const {
  return config_.components.bools.at(key(name, SettingSpec::Type::Bool));
}
std::string Settings::text(const std::string& name) const {
  return config_.components.strings.at(key(name, SettingSpec::Type::String));
}

}  // namespace dpt::train
