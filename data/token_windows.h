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
#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "data/token_file.h"

namespace dpt::data {

enum class WindowMode { Sequential, Random };
WindowMode parse_window_mode(const std::string& text);  // "sequential" or "random"
const char* window_mode_name(WindowMode mode);

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
  // Copies `count` tokens starting at absolute position `pos` of the source into `out`.
  virtual void read_tokens(int64_t pos, int64_t count, int32_t* out) const = 0;

 private:
  int64_t seq_len_;
  WindowMode mode_;
  uint64_t seed_;
  int64_t begin_ = 0, end_ = 0;
  int64_t num_windows_ = 0;
};

// Windows over a `.bin` token file (token_file.h), memory-mapped.
class TokenFileDataset : public TokenWindowDataset {
 public:
  TokenFileDataset(const std::string& path, int64_t seq_len, WindowMode mode, uint64_t seed, Range range = {});
  std::string describe() const override;
  int64_t max_token() const { return max_token_; }

 protected:
  void read_tokens(int64_t pos, int64_t count, int32_t* out) const override;

 private:
  std::unique_ptr<TokenFile> file_;
  int64_t max_token_ = 0;
};

}  // namespace dpt::data
