#pragma once
// GPT-2's tokenizer: byte-level BPE over its 50,257-token vocabulary (data/gpt2/: encoder.json and
// vocab.bpe), giving the ids of OpenAI's encoder and of tiktoken's "gpt2" encoding, which the token
// files of llm.c and nanoGPT hold.
//
// encode: the text is cut into pieces (data/gpt2_pretokenize.h); the bytes of a piece start as one token
// each, and the adjacent pair whose merge has the lowest rank (the earliest line of vocab.bpe; the
// leftmost on a tie) is merged, again and again, until no adjacent pair has a merge. Special tokens are
// not recognised: "<|endoftext|>" in the text is encoded as ordinary text (tiktoken's encode_ordinary).
// decode: the tokens' bytes, concatenated. Every byte is a token, so decode(encode(x)) == x for every
// byte string x, invalid UTF-8 included.
//
// The files write each token's bytes through GPT-2's byte-to-unicode mapping (gpt2_byte_to_unicode());
// loading maps them back, so the tokenizer works on raw bytes from then on.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dpt::data {

class Gpt2Tokenizer {
 public:
  // Reads `dir`/encoder.json and `dir`/vocab.bpe. Throws naming the file (and line or token) when one is
  // missing or malformed: ids not exactly 0..N-1, a token outside the byte alphabet, a byte without its
  // own token, a merge of unknown tokens or whose result is not a token, a repeated merge.
  static Gpt2Tokenizer load(const std::string& dir = default_dir());
  Gpt2Tokenizer(const std::string& encoder_json_path, const std::string& merges_path);

  // The folder of the vocabulary files: $DPT_GPT2_DIR when set, else data/gpt2 of this source tree.
  static std::string default_dir();

  std::vector<int32_t> encode(std::string_view text) const;
  // Throws for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  // The id of "<|endoftext|>" (50256 in GPT-2), or -1 when the vocabulary has none.
  int32_t end_of_text() const { return end_of_text_; }
  const std::string& token_bytes(int32_t id) const;

 private:
  struct Merge {
    int32_t rank;    // line of vocab.bpe, from 0
    int32_t result;  // the merged token
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  // Fills tokens_, byte_ids_ and end_of_text_; returns the ids by token as the files write it.
  std::unordered_map<std::string, int32_t> read_vocabulary(const std::string& encoder_json_path);
  void read_merges(const std::string& merges_path, const std::unordered_map<std::string, int32_t>& ids,
                   const std::string& encoder_json_path);
  // Appends the tokens of one piece to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;      // id -> bytes
  std::array<int32_t, 256> byte_ids_{};  // byte -> its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t end_of_text_ = -1;
};

// GPT-2's byte-to-unicode mapping: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves, the other 68 bytes in ascending order for U+0100, U+0101, ... (so ' ' is 'Ġ', U+0120),
// which keeps every token of the vocabulary files printable and free of spaces.
std::array<char32_t, 256> gpt2_byte_to_unicode();

}  // namespace dpt::data
