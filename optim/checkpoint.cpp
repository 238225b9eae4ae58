#include "optim/checkpoint.h"

#include <charconv>
#include <cstring>

#include "core/error.h"

namespace dpt::optim {

namespace {

constexpr const char* kStep = "dpt.step";
constexpr const char* kSeed = "dpt.rng_seed";
constexpr const char* kOffset = "dpt.rng_offset";

// The file's own metadata proves it is not a checkpoint of ours (or a damaged one): DamagedFile.
template <class T>
T parse_number(const SafetensorsMetadata& meta, const char* key, const std::string& file) {
  auto it = meta.find(key);
  if (it == meta.end()) throw DamagedFile(fmt::format("checkpoint '{}': metadata has no '{}'", file, key));
  T value{};
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw DamagedFile(fmt::format("checkpoint '{}': metadata '{}' = '{}' is not a number", file, key, s));
  }
  return value;
}

// The index of the first inf or NaN of a floating tensor, or -1. Read from the bits (exponent all ones)
// so one loop serves the four floating dtypes: bits [mantissa, mantissa + exponent) of each element.
template <class Bits>
int64_t first_non_finite(const Tensor& t, int mantissa_bits, int exponent_bits) {
  const Bits all_ones = static_cast<Bits>((Bits{1} << exponent_bits) - 1);
  const auto* p = static_cast<const unsigned char*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); ++i) {
    Bits b;
    std::memcpy(&b, p + static_cast<size_t>(i) * sizeof(Bits), sizeof(Bits));
    if (static_cast<Bits>((b >> mantissa_bits) & all_ones) == all_ones) return i;
  }
  return -1;
}

int64_t first_non_finite(const Tensor& t) {
  switch (t.dtype()) {
    case DType::Float32:
      return first_non_finite<uint32_t>(t, 23, 8);
    case DType::Float64:
      return first_non_finite<uint64_t>(t, 52, 11);
    case DType::BFloat16:
      return first_non_finite<uint16_t>(t, 7, 8);
    case DType::Float16:
      return first_non_finite<uint16_t>(t, 10, 5);
    default:
      return -1;
  }
}

// Weights or optimizer state with an inf or NaN cannot continue a run (every step would be skipped, and
// the next checkpoint would hold them again): the checkpoint is refused as damaged.
void check_finite(const NamedTensors& tensors, const std::string& file) {
  for (const auto& [name, t] : tensors) {
    const int64_t at = first_non_finite(t);
    if (at >= 0) {
      throw DamagedFile(fmt::format("checkpoint '{}': tensor '{}' holds a non-finite value (inf or NaN) at element {}",
                                    file, name, at));
    }
  }
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
  if (model_step != ck.state.step) {
    throw DamagedFile(
        fmt::format("checkpoint '{}': model file is from step {} but optimizer file from step {} (interrupted save?)",
                    prefix, model_step, ck.state.step));
  }
  check_finite(model.tensors, model_file);
  check_finite(optim.tensors, optim_file);
  ck.checksummed = model.checksummed && optim.checksummed;
  for (const auto& [k, v] : optim.metadata)
    if (k.rfind("dpt.", 0) != 0) ck.state.extra[k] = v;
  ck.model = std::move(model.tensors);
  ck.optimizer = std::move(optim.tensors);
  return ck;
}

}  // namespace dpt::optim
