#include "data/gpt2_bpe.h"

#include <unicode/utf8.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>

#include "core/error.h"
#include "core/flags.h"
#include "data/char_text.h"
#include "data/gpt2_pretokenize.h"

#ifndef DPT_GPT2_DIR
#error "DPT_GPT2_DIR (the source tree's data/gpt2) must be defined by the build"
#endif

namespace dpt::data {

namespace {

// A token of the vocabulary files (UTF-8 text in the byte-to-unicode alphabet) as its raw bytes.
// Returns false when a character is outside the alphabet or the text is not UTF-8.
bool unmapped_bytes(const std::string& text, const std::unordered_map<char32_t, uint8_t>& unicode_to_byte,
                    std::string& out) {
  out.clear();
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const auto length = static_cast<int32_t>(text.size());
  for (int32_t i = 0; i < length;) {
    UChar32 c = 0;
    U8_NEXT(s, i, length, c);
    if (c < 0) return false;
    auto it = unicode_to_byte.find(static_cast<char32_t>(c));
    if (it == unicode_to_byte.end()) return false;
    out.push_back(static_cast<char>(it->second));
  }
  return true;
}

std::string utf8(char32_t c) {
  uint8_t buffer[U8_MAX_LENGTH];
  int32_t length = 0;
  U8_APPEND_UNSAFE(buffer, length, static_cast<UChar32>(c));
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(length));
}

std::unordered_map<char32_t, uint8_t> unicode_to_byte_map() {
  std::unordered_map<char32_t, uint8_t> out;
  const std::array<char32_t, 256> forward = gpt2_byte_to_unicode();
  for (int b = 0; b < 256; ++b) out[forward[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
  return out;
}

}  // namespace

std::array<char32_t, 256> gpt2_byte_to_unicode() {
  std::array<char32_t, 256> out{};
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) out[static_cast<size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
  return out;
}

std::string Gpt2Tokenizer::default_dir() {
  const std::string dir = flag_value(Flag::Gpt2Dir);
  return dir.empty() ? std::string(DPT_GPT2_DIR) : dir;
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  return Gpt2Tokenizer(dir + "/encoder.json", dir + "/vocab.bpe");
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& encoder_json_path, const std::string& merges_path) {
  const std::unordered_map<std::string, int32_t> ids = read_vocabulary(encoder_json_path);
  read_merges(merges_path, ids, encoder_json_path);
}

std::unordered_map<std::string, int32_t> Gpt2Tokenizer::read_vocabulary(const std::string& encoder_json_path) {
  const std::unordered_map<char32_t, uint8_t> unicode_to_byte = unicode_to_byte_map();
  // encoder.json: {"token": id, ...}, ids exactly 0..N-1.
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_text_file(encoder_json_path));
  } catch (const nlohmann::json::exception& e) {
    DPT_FAIL("GPT-2 vocabulary '{}': not valid JSON: {}", encoder_json_path, e.what());
  }
  DPT_CHECK(encoder.is_object() && !encoder.empty(),
            "GPT-2 vocabulary '{}': expected a JSON object of token -> id, got {}", encoder_json_path,
            encoder.type_name());
  const auto count = static_cast<int64_t>(encoder.size());
  tokens_.resize(static_cast<size_t>(count));
  std::vector<bool> seen(static_cast<size_t>(count), false);
  std::unordered_map<std::string, int32_t> ids;  // as written in the files
  for (const auto& [text, value] : encoder.items()) {
    DPT_CHECK(value.is_number_integer(), "GPT-2 vocabulary '{}': token '{}' has id {}, expected an integer",
              encoder_json_path, text, value.dump());
    const auto id = value.get<int64_t>();
    DPT_CHECK(id >= 0 && id < count && !seen[static_cast<size_t>(id)],
              "GPT-2 vocabulary '{}': token '{}' has id {}, expected each of 0..{} exactly once", encoder_json_path,
              text, id, count - 1);
    seen[static_cast<size_t>(id)] = true;
    DPT_CHECK(unmapped_bytes(text, unicode_to_byte, tokens_[static_cast<size_t>(id)]),
              "GPT-2 vocabulary '{}': token '{}' (id {}) has a character outside GPT-2's byte alphabet",
              encoder_json_path, text, id);
    ids.emplace(text, static_cast<int32_t>(id));
  }
  // Every byte has a token of its own: the starting point of every piece's merges.
  const std::array<char32_t, 256> forward = gpt2_byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    auto it = ids.find(utf8(forward[static_cast<size_t>(b)]));
    DPT_CHECK(it != ids.end(), "GPT-2 vocabulary '{}': byte {} has no token of its own ('{}')", encoder_json_path, b,
              utf8(forward[static_cast<size_t>(b)]));
    byte_ids_[static_cast<size_t>(b)] = it->second;
  }
  auto eot = ids.find("<|endoftext|>");
  if (eot != ids.end()) end_of_text_ = eot->second;
  return ids;
}

void Gpt2Tokenizer::read_merges(const std::string& merges_path, const std::unordered_map<std::string, int32_t>& ids,
                                const std::string& encoder_json_path) {
  // vocab.bpe: an optional "#version" line, then "left right" per line, in rank order.
  std::ifstream in(merges_path);
  DPT_CHECK(in.good(), "GPT-2 merges '{}': cannot open: {}", merges_path, std::strerror(errno));
  int32_t rank = 0;
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty() || (line_number == 1 && line[0] == '#')) continue;
    const size_t space = line.find(' ');
    DPT_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                  line.find(' ', space + 1) == std::string::npos,
              "GPT-2 merges '{}' line {}: expected two tokens separated by one space, got '{}'", merges_path,
              line_number, line);
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    auto l = ids.find(left), r = ids.find(right), merged = ids.find(left + right);
    DPT_CHECK(l != ids.end() && r != ids.end() && merged != ids.end(),
              "GPT-2 merges '{}' line {}: '{}' is not in the vocabulary '{}'", merges_path, line_number,
              l == ids.end()   ? left
              : r == ids.end() ? right
                               : left + right,
              encoder_json_path);
    const bool fresh = merges_.emplace(pair_key(l->second, r->second), Merge{rank, merged->second}).second;
    DPT_CHECK(fresh, "GPT-2 merges '{}' line {}: the merge '{}' appears twice", merges_path, line_number, line);
    ++rank;
  }
  DPT_CHECK(!in.bad(), "GPT-2 merges '{}': read error", merges_path);
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  DPT_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside GPT-2's vocabulary [0, {})", id, vocab_size());
  return tokens_[static_cast<size_t>(id)];
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  // Text repeats its words: each distinct piece is merged once.
  std::unordered_map<std::string_view, std::vector<int32_t>> done;
  for (std::string_view piece : gpt2_pretokenize(text)) {
    auto [it, fresh] = done.try_emplace(piece);
    if (fresh) encode_piece(piece, it->second);
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

// The merges of one piece, lowest rank first and leftmost among equals, as OpenAI's encoder and tiktoken
// apply them. The piece is a linked list of tokens and a min-heap holds the mergeable adjacent pairs;
// a heap entry whose tokens have changed since it was pushed is stale and skipped. O(n log n), so a
// long run of one character (a piece can be a megabyte of spaces) cannot stall the encoder.
void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  struct Node {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev, next;
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Node> nodes(piece.size());
  for (int32_t i = 0; i < n; ++i) nodes[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  using Candidate = std::tuple<int32_t, int32_t, int32_t, int32_t>;  // rank, left position, left id, right id
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || nodes[left].next < 0) return;
    const int32_t a = nodes[left].id, b = nodes[nodes[left].next].id;
    auto it = merges_.find(pair_key(a, b));
    if (it != merges_.end()) heap.emplace(it->second.rank, left, a, b);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, left, a, b] = heap.top();
    heap.pop();
    Node& l = nodes[left];
    // Stale: the left token was merged away or grew, or its right neighbour is another token now.
    if (l.id != a || l.next < 0 || nodes[l.next].id != b) continue;
    Node& r = nodes[l.next];
    l.id = merges_.at(pair_key(a, b)).result;
    r.id = -1;
    l.next = r.next;
    if (r.next >= 0) nodes[r.next].prev = left;
    push(l.prev);
    push(left);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = nodes[i].next) out.push_back(nodes[i].id);
}

}  // namespace dpt::data
