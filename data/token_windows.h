#pragma once
// Next-token prediction batches from a token sequence. Example i is a window of T + 1 tokens starting
// at window_start(i): input = tokens[s, s + T), target = tokens[s + 1, s + T + 1); a batch is
// input and target int32 [B, T].
//   sequential: windows tile the sequence, s = i·T, (N - 1) / T of them (the tail is dropped);
//   random:     the same number of windows per epoch, each at a start drawn uniformly from
//               [0, N - T - 1] by (seed, epoch, i): every example drawn sees a fresh window, as
//               nanoGPT's batch sampler does, and a position (epoch, batch) still names the same
//               batch, so resuming is exact. Ranks differ through i (the sampler gives each its own).
// A Range restricts the dataset to a fraction of the sequence (e.g. [0, 0.9) train, [0.9, 1) val).
//
// Sharded sources: the sequence may be the concatenation of segments (shards) that no window crosses,
// as in llm.c's DataLoader, which reads every batch from within one shard and moves to the next shard
// when a batch would run past the end of this one (each shard of its data scripts starts at a document
// boundary, and a read stays within one mapped file). Windows are then counted per segment (its tail
// dropped): sequential tiles each segment, random draws each window's start within the segment the
// window's index falls in. One segment behaves exactly as the unsharded description above.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/token_file.h"

namespace dpt::data {

enum class WindowMode { Sequential, Random };
WindowMode parse_window_mode(const std::string& text);  // "sequential" or "random"

struct Range {
  double begin = 0.0;
  double end = 1.0;
};

class TokenWindowDataset : public Dataset {
 public:
  int64_t size() const override { return num_windows_; }

  int64_t seq_len() const { return seq_len_; }
  int64_t num_tokens() const { return end_ - begin_; }       // tokens in this dataset's range
  int64_t window_start(int64_t index, int64_t epoch) const;  // relative to the range's first token

 protected:
  TokenWindowDataset(int64_t seq_len, WindowMode mode, uint64_t seed);
  Batch gather(const std::vector<int64_t>& indices, int64_t epoch) const override;
  // Call once the source length is known: selects the range and counts windows (throws naming
  // describe() when fewer than seq_len + 1 tokens remain).
  void init_windows(int64_t total_tokens, Range range);
  // The same over segments of these lengths, concatenated; the range applies to the concatenation, and
  // a segment left with fewer than seq_len + 1 tokens in it holds no window.
  void init_windows(const std::vector<int64_t>& segment_tokens, Range range);
  // Copies `count` tokens starting at absolute position `pos` of the source into `out`.
  virtual void read_tokens(int64_t pos, int64_t count, int32_t* out) const = 0;

 private:
  int64_t seq_len_;
  WindowMode mode_;
  uint64_t seed_;
  int64_t begin_ = 0, end_ = 0;
  int64_t num_windows_ = 0;
  // The pieces of segments inside the range that hold windows: where each starts (relative to begin_),
  // its length, and the index of its first window.
  struct Piece {
    int64_t start = 0, tokens = 0, first_window = 0;
  };
  std::vector<Piece> pieces_;
};

// Windows over a `.bin` token file (token_file.h), memory-mapped; or over shards when `path` is a glob
// pattern (token_shards.h): each shard is validated as a file of its own, and no window crosses two.
class TokenFileDataset : public TokenWindowDataset {
 public:
  TokenFileDataset(const std::string& path, int64_t seq_len, WindowMode mode, uint64_t seed, Range range = {});
  std::string describe() const override;
  int64_t max_token() const { return max_token_; }
  int64_t num_shards() const { return static_cast<int64_t>(files_.size()); }

 protected:
  void read_tokens(int64_t pos, int64_t count, int32_t* out) const override;

 private:
  std::string path_;
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<int64_t> offsets_;  // where each shard starts in the concatenation
  int64_t total_tokens_ = 0;
  int64_t max_token_ = 0;
};

}  // namespace dpt::data
