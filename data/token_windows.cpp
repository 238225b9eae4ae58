#include "data/token_windows.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "data/counter_random.h"
#include "data/token_file.h"
#include "data/token_shards.h"

namespace dpt::data {

namespace {
constexpr uint64_t kStreamWindowStart = 301;
}  // namespace

WindowMode parse_window_mode(const std::string& text) {
  if (text == "sequential") return WindowMode::Sequential;
  if (text == "random") return WindowMode::Random;
  DPT_FAIL("window mode must be 'sequential' or 'random', got '{}'", text);
}

TokenWindowDataset::TokenWindowDataset(int64_t seq_len, WindowMode mode, uint64_t seed)
    : seq_len_(seq_len), mode_(mode), seed_(seed) {
  DPT_CHECK(seq_len >= 1, "token windows: seq_len must be >= 1, got {}", seq_len);
}

void TokenWindowDataset::init_windows(int64_t total_tokens, Range range) {
  init_windows(std::vector<int64_t>{total_tokens}, range);
}

void TokenWindowDataset::init_windows(const std::vector<int64_t>& segment_tokens, Range range) {
  DPT_CHECK(range.begin >= 0 && range.begin < range.end && range.end <= 1,
            "{}: range [{}, {}) must satisfy 0 <= begin < end <= 1", describe(), range.begin, range.end);
  int64_t total_tokens = 0;
  for (int64_t n : segment_tokens) total_tokens += n;
  begin_ = static_cast<int64_t>(std::floor(range.begin * static_cast<double>(total_tokens)));
  end_ = static_cast<int64_t>(std::floor(range.end * static_cast<double>(total_tokens)));
  const int64_t n = end_ - begin_;
  DPT_CHECK(n >= seq_len_ + 1,
            "{}: {} tokens in range [{}, {}) but a window of seq_len {} needs at least {} (input plus the shifted "
            "target)",
            describe(), n, range.begin, range.end, seq_len_, seq_len_ + 1);
  pieces_.clear();
  num_windows_ = 0;
  int64_t segment_begin = 0;
  for (int64_t tokens : segment_tokens) {
    const int64_t from = std::max(segment_begin, begin_), to = std::min(segment_begin + tokens, end_);
    segment_begin += tokens;
    if (to - from < seq_len_ + 1) continue;
    pieces_.push_back({from - begin_, to - from, num_windows_});
    num_windows_ += (to - from - 1) / seq_len_;
  }
  DPT_CHECK(num_windows_ > 0,
            "{}: no shard holds a window of seq_len {} in range [{}, {}) (windows do not cross shards; each needs "
            "{} tokens)",
            describe(), seq_len_, range.begin, range.end, seq_len_ + 1);
}

int64_t TokenWindowDataset::window_start(int64_t index, int64_t epoch) const {
  // The piece holding window `index`: the last whose first window is <= index.
  const auto it = std::upper_bound(pieces_.begin(), pieces_.end(), index,
                                   [](int64_t i, const Piece& p) { return i < p.first_window; });
  const Piece& piece = *(it - 1);
  if (mode_ == WindowMode::Sequential) return piece.start + (index - piece.first_window) * seq_len_;
  const auto starts = static_cast<uint64_t>(piece.tokens - seq_len_);  // valid starts: [0, n - T - 1]
  // One counter per (epoch, index) draw: epochs never reuse a counter while index < num_windows_.
  const uint64_t draw =
      static_cast<uint64_t>(epoch) * static_cast<uint64_t>(num_windows_) + static_cast<uint64_t>(index);
  return piece.start + static_cast<int64_t>(random::below(seed_, kStreamWindowStart, draw, starts));
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
    : TokenWindowDataset(seq_len, mode, seed), path_(path) {
  std::vector<int64_t> sizes;
  for (const std::string& shard : token_shard_paths(path)) {
    files_.push_back(std::make_unique<TokenFile>(shard));
    offsets_.push_back(total_tokens_);
    sizes.push_back(files_.back()->size());
    total_tokens_ += files_.back()->size();
    max_token_ = std::max<int64_t>(max_token_, files_.back()->max_token());
  }
  init_windows(sizes, range);
}

std::string TokenFileDataset::describe() const {
  if (!is_glob_pattern(path_)) return fmt::format("token file '{}' ({} tokens)", path_, total_tokens_);
  return fmt::format("token shards '{}' ({} files, {} tokens)", path_, files_.size(), total_tokens_);
}

void TokenFileDataset::read_tokens(int64_t pos, int64_t count, int32_t* out) const {
  const auto shard =
      static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), pos) - offsets_.begin() - 1);
  const TokenFile& file = *files_[shard];
  const int64_t local = pos - offsets_[shard];
  DPT_CHECK(local + count <= file.size(), "{}: a read of {} tokens at {} crosses the end of shard '{}'", describe(),
            count, pos, file.path());
  const uint16_t* src = file.tokens() + local;
  for (int64_t i = 0; i < count; ++i) out[i] = src[i];
}

}  // namespace dpt::data
