#include "data/char_text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dpt::data {

CharVocab::CharVocab(const std::string& text) {
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (!seen[static_cast<size_t>(b)]) continue;
    ids_[static_cast<size_t>(b)] = static_cast<int32_t>(chars_.size());
    chars_.push_back(static_cast<char>(b));
  }
}

int32_t CharVocab::encode(unsigned char c) const {
  int32_t id = ids_[c];
  DPT_CHECK(id >= 0, "character {} (byte {}) is not in the vocabulary of {} characters",
            std::isprint(c) ? fmt::format("'{}'", static_cast<char>(c)) : std::string("?"), static_cast<int>(c),
            chars_.size());
  return id;
}

std::vector<int32_t> CharVocab::encode(const std::string& text) const {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = encode(static_cast<unsigned char>(text[i]));
  return out;
}

std::string CharVocab::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    DPT_CHECK(id >= 0 && id < size(), "token id {} is outside the vocabulary [0, {})", id, size());
    out.push_back(chars_[static_cast<size_t>(id)]);
  }
  return out;
}

std::string read_text_file(const std::string& path) {
  DPT_CHECK(std::filesystem::is_regular_file(path), "text file '{}': does not exist or is not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  DPT_CHECK(in.good(), "text file '{}': cannot open: {}", path, std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  DPT_CHECK(!in.bad(), "text file '{}': read error", path);
  return buffer.str();
}

CharTextDataset::CharTextDataset(const std::string& path, int64_t seq_len, WindowMode mode, uint64_t seed, Range range)
    : TokenWindowDataset(seq_len, mode, seed), path_(path), text_(read_text_file(path)), vocab_(text_) {
  DPT_CHECK(!text_.empty(), "text file '{}': is empty", path);
  ids_ = vocab_.encode(text_);
  init_windows(static_cast<int64_t>(ids_.size()), range);
}

std::string CharTextDataset::describe() const {
  return fmt::format("text file '{}' ({} characters, vocabulary {})", path_, text_.size(), vocab_.size());
}

void CharTextDataset::read_tokens(int64_t pos, int64_t count, int32_t* out) const {
  std::copy_n(ids_.begin() + pos, count, out);
}

}  // namespace dpt::data
