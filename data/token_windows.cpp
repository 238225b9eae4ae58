#include "data/token_windows.h"

#include <cmath>
#include <memory>

#include "core/error.h"
#include "data/counter_random.h"
#include "data/token_file.h"

namespace dpt::data {

namespace {
constexpr uint64_t kStreamWindowStart = 301;
}  // namespace

WindowMode parse_window_mode(const std::string& text) {
  if (text == "sequential") return WindowMode::Sequential;
  if (text == "random") return WindowMode::Random;
  DPT_FAIL("window mode must be 'sequential' or 'random', got '{}'", text);
}

const char* window_mode_name(WindowMode mode) { return mode == WindowMode::Sequential ? "sequential" : "random"; }

TokenWindowDataset::TokenWindowDataset(int64_t seq_len, WindowMode mode, uint64_t seed)
    : seq_len_(seq_len), mode_(mode), seed_(seed) {
  DPT_CHECK(seq_len >= 1, "token windows: seq_len must be >= 1, got {}", seq_len);
}

void TokenWindowDataset::init_windows(int64_t total_tokens, Range range) {
  DPT_CHECK(range.begin >= 0 && range.begin < range.end && range.end <= 1,
            "{}: range [{}, {}) must satisfy 0 <= begin < end <= 1", describe(), range.begin, range.end);
  begin_ = static_cast<int64_t>(std::floor(range.begin * static_cast<double>(total_tokens)));
  end_ = static_cast<int64_t>(std::floor(range.end * static_cast<double>(total_tokens)));
  const int64_t n = end_ - begin_;
  DPT_CHECK(n >= seq_len_ + 1,
            "{}: {} tokens in range [{}, {}) but a window of seq_len {} needs at least {} (input plus the shifted "
            "target)",
            describe(), n, range.begin, range.end, seq_len_, seq_len_ + 1);
  num_windows_ = (n - 1) / seq_len_;
}

int64_t TokenWindowDataset::window_start(int64_t index, int64_t epoch) const {
  if (mode_ == WindowMode::Sequential) return index * seq_len_;
  const auto starts = static_cast<uint64_t>(num_tokens() - seq_len_);  // valid starts: [0, n - T - 1]
  // One counter per (epoch, index) draw: epochs never reuse a counter while index < num_windows_.
  const uint64_t draw = static_cast<uint64_t>(epoch) * static_cast<uint64_t>(num_windows_) + static_cast<uint64_t>(index);
  return static_cast<int64_t>(random::below(seed_, kStreamWindowStart, draw, starts));
}

Batch TokenWindowDataset::gather(const std::vector<int64_t>& indices, int64_t epoch) const {
  const auto b = static_cast<int64_t>(indices.size());
  const TensorOptions int32 = TensorOptions{}.with_dtype(DType::Int32);
  Tensor input = Tensor::empty({b, seq_len_}, int32);
  Tensor target = Tensor::empty({b, seq_len_}, int32);
  std::vector<int32_t> window(static_cast<size_t>(seq_len_ + 1));
  for (int64_t row = 0; row < b; ++row) {
    read_tokens(begin_ + window_start(indices[static_cast<size_t>(row)], epoch), seq_len_ + 1, window.data());
    std::copy(window.begin(), window.end() - 1, input.data<int32_t>() + row * seq_len_);
    std::copy(window.begin() + 1, window.end(), target.data<int32_t>() + row * seq_len_);
  }
  return {input, target};
}

TokenFileDataset::TokenFileDataset(const std::string& path, int64_t seq_len, WindowMode mode, uint64_t seed,
                                   Range range)
    : TokenWindowDataset(seq_len, mode, seed), file_(std::make_unique<TokenFile>(path)) {
  max_token_ = file_->max_token();
  init_windows(file_->size(), range);
}

std::string TokenFileDataset::describe() const {
  return fmt::format("token file '{}' ({} tokens)", file_->path(), file_->size());
}

void TokenFileDataset::read_tokens(int64_t pos, int64_t count, int32_t* out) const {
  const uint16_t* src = file_->tokens() + pos;
  for (int64_t i = 0; i < count; ++i) out[i] = src[i];
}

}  // namespace dpt::data
