#include "vocab_metadata.h"

#include "core/error.h"

namespace dpt::train {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string encode_char_vocab(const data::CharVocab& vocab) {
  std::string out;
  for (char c : vocab.chars()) out += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return out;
}

data::CharVocab decode_char_vocab(const std::string& text) {
  DPT_CHECK(!text.empty() && text.size() % 2 == 0, "checkpoint metadata '{}': expected hex pairs, got {} characters",
            kCharVocabKey, text.size());
  std::string chars;
  for (size_t i = 0; i < text.size(); i += 2) {
    const int hi = hex_digit(text[i]), lo = hex_digit(text[i + 1]);
    DPT_CHECK(hi >= 0 && lo >= 0, "checkpoint metadata '{}': '{}' at offset {} is not a lowercase hex pair",
              kCharVocabKey, text.substr(i, 2), i);
    const auto byte = static_cast<unsigned char>(hi * 16 + lo);
    // A CharVocab lists its bytes ascending: anything else would decode ids to other characters.
    DPT_CHECK(chars.empty() || static_cast<unsigned char>(chars.back()) < byte,
              "checkpoint metadata '{}': bytes must be distinct and ascending, byte {} follows {}", kCharVocabKey,
              static_cast<int>(byte), static_cast<int>(static_cast<unsigned char>(chars.back())));
    chars.push_back(static_cast<char>(byte));
  }
  return data::CharVocab(chars);
}

std::optional<data::CharVocab> checkpoint_char_vocab(const optim::Checkpoint& checkpoint) {
  auto it = checkpoint.state.extra.find(kCharVocabKey);
  if (it == checkpoint.state.extra.end()) return std::nullopt;
  return decode_char_vocab(it->second);
}

}  // namespace dpt::train
