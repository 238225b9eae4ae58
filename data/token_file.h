#pragma once
// Token files in the common `.bin` layout (llm.c and the tokenizer scripts around it):
//   a header of 256 little-endian int32: [0] magic 20240520, [1] version 1, [2] token count N,
//   the rest zero; then N uint16 tokens. The file is exactly 1024 + 2N bytes.
// TokenFile maps a file read-only and validates it; write_token_file produces one.
#include <cstdint>
#include <string>
#include <vector>

namespace dpt::data {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int64_t kTokenFileHeaderInts = 256;
constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

class TokenFile {
 public:
  // Throws a dpt::Error naming the file for: missing/unreadable, not a regular file (a FIFO is refused
  // without blocking), shorter than the header, wrong magic, wrong version, negative count, fewer or
  // more token bytes than the header declares.
  explicit TokenFile(std::string path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // number of tokens
  const uint16_t* tokens() const { return tokens_; }
  uint16_t operator[](int64_t i) const { return tokens_[i]; }
  uint16_t max_token() const;  // largest token id in the file (scans it)

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

// Writes `tokens` in the layout above; the file appears atomically (temp file + rename).
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

// A learnable synthetic corpus: each token follows its predecessor by a fixed random transition
// (t -> (a·t + b) mod vocab) with probability 1 - noise, else is uniform. Pure function of the seed.
std::vector<uint16_t> synthetic_tokens(int64_t count, int64_t vocab_size, uint64_t seed, double noise = 0.1);

// Writes synthetic_tokens(...) to `path` (marked as generated in the header's reserved ints) unless that
// very corpus is there already; returns true when it wrote. Used to generate the data of default configs
// on first use. Only a file it wrote itself is ever rewritten (other parameters, or damaged): any other
// file at `path` (a real token file, anything else) is an error naming it, and stays as it is.
bool ensure_synthetic_token_file(const std::string& path, int64_t count, int64_t vocab_size, uint64_t seed);

}  // namespace dpt::data
