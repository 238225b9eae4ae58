#pragma once
// A named set of components of one kind (optimizers, datasets, a GPT block's feed-forward, ...): each
// entry has a name, the settings it reads (its keys, with type, default, allowed values and meaning) and
// a factory. The trainer's config schema lists every entry's keys, so a component added here is
// validated, documented in the config reference and selectable by name without touching the config code.
//
// A registry is a function-local static behind an accessor (`Registry<F>& optimizers()`), never a
// namespace-scope object, so registering from another file's static initializer cannot run before it
// exists. Entries register either from the accessor's own list (components inside a static library,
// whose unreferenced objects the linker would drop) or with DPT_REGISTER in a source file the program
// links directly.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace dpt {

// One setting of a component, under its section's key "<section>.<component>.<name>".
struct SettingSpec {
  enum class Type { Int, Float, Bool, String, Choice };
  std::string name{};
  Type type = Type::Float;
  std::string default_value{};         // as written in YAML
  std::vector<std::string> choices{};  // Choice
  std::optional<double> min{};         // Int, Float
  std::optional<double> max{};
  std::string help{};
};

template <class Factory>
class Registry {
 public:
  struct Entry {
    std::string name;
    std::string help;
    std::vector<SettingSpec> settings;
    Factory make;
  };

  // Throws on a second entry of the same name: two components must not silently shadow each other.
  void add(Entry entry) {
    DPT_CHECK(!entry.name.empty(), "registry: an entry needs a name");
    DPT_CHECK(find(entry.name) == nullptr, "registry: '{}' is registered twice", entry.name);
    entries_.push_back(std::move(entry));
  }
  const Entry* find(const std::string& name) const {
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
    return it == entries_.end() ? nullptr : &*it;
  }
  // In registration order: the accessor's list first, then self-registered entries.
  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.name);
    return out;
  }

 private:
  std::vector<Entry> entries_;
};

}  // namespace dpt

#define DPT_REGISTRY_CONCAT_INNER(a, b) a##b
#define DPT_REGISTRY_CONCAT(a, b) DPT_REGISTRY_CONCAT_INNER(a, b)
// DPT_REGISTER(accessor, entry): adds `entry` to accessor() while the program starts. Use it in a source
// the program links directly (an executable's own sources); see the top of this file.
#define DPT_REGISTER(accessor, ...)                                                 \
  namespace {                                                                       \
  [[maybe_unused]] const bool DPT_REGISTRY_CONCAT(dpt_registered_, __LINE__) = [] { \
    accessor().add(__VA_ARGS__);                                                    \
    return true;                                                                    \
  }();                                                                              \
  }
