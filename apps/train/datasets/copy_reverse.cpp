// data.kind copy_reverse: an algorithmic token task for checking that a GPT learns at all, in seconds on a
// CPU. Each example is L random symbols, a separator, then the same symbols copied or reversed:
//   s = a_1 .. a_L SEP b_1 .. b_L,   b = a (copy) or b_i = a_(L+1-i) (reverse)
// input = s[0, 2L), target = s[1, 2L], with the first L targets (the unpredictable symbols and the
// separator) set to -100 so the loss counts only the answer. Symbols are 0 .. symbols-1, SEP = symbols.
// Example i is a pure function of (seed, i); the validation examples come from another stream.
#include <spdlog/fmt/fmt.h>

#include "components.h"
#include "core/factory.h"
#include "data/counter_random.h"
#include "data/tensor_dataset.h"

namespace dpt::train {
namespace {

constexpr uint64_t kStreamTrain = 301;
constexpr uint64_t kStreamVal = 302;

std::shared_ptr<data::TensorDataset> sequences(int64_t count, int64_t length, int64_t symbols, bool reverse,
                                               uint64_t seed, uint64_t stream, const std::string& name) {
  const int64_t t = 2 * length;
  std::vector<int32_t> input(static_cast<size_t>(count * t)), target(static_cast<size_t>(count * t));
  std::vector<int32_t> s(static_cast<size_t>(t + 1));
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t j = 0; j < length; ++j) {
      s[j] = static_cast<int32_t>(
          data::random::below(seed, stream, static_cast<uint64_t>(i * length + j), static_cast<uint64_t>(symbols)));
    }
    s[length] = static_cast<int32_t>(symbols);
    for (int64_t j = 0; j < length; ++j) s[length + 1 + j] = s[reverse ? length - 1 - j : j];
    for (int64_t p = 0; p < t; ++p) {
      input[i * t + p] = s[p];
      target[i * t + p] = p < length ? -100 : s[p + 1];
    }
  }
  const TensorOptions i32 = TensorOptions{}.with_dtype(DType::Int32);
  return std::make_shared<data::TensorDataset>(from_vector(input, {count, t}, i32),
                                               from_vector(target, {count, t}, i32), name);
}

DataBundle make_copy_reverse(const Config& c, const Settings& s) {
  const int64_t length = s.integer("length"), symbols = s.integer("symbols"), count = s.integer("examples");
  const bool reverse = s.text("task") == "reverse";
  const auto seed = static_cast<uint64_t>(c.training.seed);
  const std::string task = fmt::format("{} task ({} symbols of {})", s.text("task"), length, symbols);
  DataBundle out;
  out.shape.tokens = true;
  out.shape.seq_len = 2 * length;
  out.shape.vocab_size = symbols + 1;
  out.train = sequences(count, length, symbols, reverse, seed, kStreamTrain, task);
  const auto val_count = static_cast<int64_t>(static_cast<double>(count) * c.data.val_fraction);
  if (val_count > 0) out.val = sequences(val_count, length, symbols, reverse, seed, kStreamVal, task + ", held out");
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::datasets,
             {"copy_reverse",
              "copy or reverse a random symbol sequence after a separator (a quick check that a GPT learns)",
              {{.name = "task",
                .type = dpt::SettingSpec::Type::Choice,
                .default_value = "reverse",
                .choices = {"copy", "reverse"},
                .help = "copy_reverse: the answer repeats the symbols (copy) or reverses them"},
               {.name = "length",
                .type = dpt::SettingSpec::Type::Int,
                .default_value = "8",
                .min = 1,
                .max = 4096,
                .help = "copy_reverse: symbols per example; a GPT sees 2 x length tokens"},
               {.name = "symbols",
                .type = dpt::SettingSpec::Type::Int,
                .default_value = "10",
                .min = 2,
                .max = 65535,
                .help = "copy_reverse: distinct symbols; the vocabulary adds one separator"},
               {.name = "examples",
                .type = dpt::SettingSpec::Type::Int,
                .default_value = "4096",
                .min = 1,
                .max = 1 << 24,
                .help = "copy_reverse: training examples; data.val_fraction of this many more are held out"}},
              {"tokens", dpt::train::make_copy_reverse}})
