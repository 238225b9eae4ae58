#include "data_factory.h"

#include "components.h"
#include "core/error.h"

namespace dpt::train {

DataBundle make_data(const Config& c) {
  // Every dataset, built-in or added, is a registry entry (apps/train/datasets/).
  const auto* entry = datasets().find(c.data.kind);
  DPT_CHECK(entry != nullptr, "data.kind '{}' is not supported by the trainer", c.data.kind);
  return entry->make.make(c, Settings(c, "data." + c.data.kind, entry->settings));
}

}  // namespace dpt::train
