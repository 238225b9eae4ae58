#include "optim/checkpoint.h"

#include <charconv>

#include "core/error.h"

namespace dpt::optim {

namespace {

constexpr const char* kStep = "dpt.step";
constexpr const char* kSeed = "dpt.rng_seed";
constexpr const char* kOffset = "dpt.rng_offset";

template <class T>
T parse_number(const SafetensorsMetadata& meta, const char* key, const std::string& file) {
  auto it = meta.find(key);
  DPT_CHECK(it != meta.end(), "checkpoint '{}': metadata has no '{}'", file, key);
  T value{};
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  DPT_CHECK(ec == std::errc() && end == s.data() + s.size(), "checkpoint '{}': metadata '{}' = '{}' is not a number",
            file, key, s);
  return value;
}

}  // namespace

void save_checkpoint(const std::string& prefix, const NamedTensors& model_state, const Optimizer* optimizer,
                     const TrainingState& state) {
  save_checkpoint(prefix, model_state, optimizer ? optimizer->state_dict() : NamedTensors{}, state);
}

void save_checkpoint(const std::string& prefix, const NamedTensors& model_state, const NamedTensors& optimizer_state,
                     const TrainingState& state) {
  SafetensorsMetadata meta;
  for (const auto& [k, v] : state.extra) {
    DPT_CHECK(k.rfind("dpt.", 0) != 0, "save_checkpoint: extra key '{}' uses the reserved 'dpt.' prefix", k);
    meta[k] = v;
  }
  meta[kStep] = std::to_string(state.step);
  meta[kSeed] = std::to_string(state.rng_seed);
  meta[kOffset] = std::to_string(state.rng_offset);
  save_safetensors(prefix + ".optim.safetensors", optimizer_state, meta);
  save_safetensors(prefix + ".model.safetensors", model_state, {{"format", "pt"}, {kStep, std::to_string(state.step)}});
}

Checkpoint load_checkpoint(const std::string& prefix) {
  const std::string model_file = prefix + ".model.safetensors", optim_file = prefix + ".optim.safetensors";
  SafetensorsContents model = load_safetensors(model_file);
  SafetensorsContents optim = load_safetensors(optim_file);
  Checkpoint ck;
  ck.state.step = parse_number<int64_t>(optim.metadata, kStep, optim_file);
  ck.state.rng_seed = parse_number<uint64_t>(optim.metadata, kSeed, optim_file);
  ck.state.rng_offset = parse_number<uint64_t>(optim.metadata, kOffset, optim_file);
  int64_t model_step = parse_number<int64_t>(model.metadata, kStep, model_file);
  DPT_CHECK(model_step == ck.state.step,
            "checkpoint '{}': model file is from step {} but optimizer file from step {} (interrupted save?)", prefix,
            model_step, ck.state.step);
  for (const auto& [k, v] : optim.metadata)
    if (k.rfind("dpt.", 0) != 0) ck.state.extra[k] = v;
  ck.model = std::move(model.tensors);
  ck.optimizer = std::move(optim.tensors);
  return ck;
}

}  // namespace dpt::optim
