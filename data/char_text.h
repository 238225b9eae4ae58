#pragma once
// Plain text as characters (bytes): the vocabulary is the sorted set of distinct bytes in the file,
// so it is deterministic and the same on every rank. Windows and batches as in token_windows.h.
#include <array>
#include <string>
#include <vector>

#include "data/token_windows.h"

namespace dpt::data {

class CharVocab {
 public:
  explicit CharVocab(const std::string& text);  // the distinct bytes of `text`, ascending
  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  int32_t encode(unsigned char c) const;  // throws for a character not in the vocabulary
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // throws for an id outside [0, size())
  const std::string& chars() const { return chars_; }

 private:
  std::string chars_;
  std::array<int32_t, 256> ids_{};  // byte -> id, -1 when absent
};

class CharTextDataset : public TokenWindowDataset {
 public:
  // Throws naming the file when it is missing, unreadable, empty, or too short for one window of the
  // chosen range. The vocabulary is built from the whole file (not only the range), so a train and a
  // validation range of one file share it.
  CharTextDataset(const std::string& path, int64_t seq_len, WindowMode mode, uint64_t seed, Range range = {});
  std::string describe() const override;
  const CharVocab& vocab() const { return vocab_; }
  const std::vector<int32_t>& ids() const { return ids_; }

 protected:
  void read_tokens(int64_t pos, int64_t count, int32_t* out) const override;

 private:
  std::string path_;
  std::string text_;
  CharVocab vocab_;
  std::vector<int32_t> ids_;
};

std::string read_text_file(const std::string& path);  // whole file; throws naming it when unreadable

}  // namespace dpt::data
