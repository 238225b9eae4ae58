#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/counter_random.h"

namespace dpt::data {

namespace {
constexpr uint64_t kStreamTransition = 201;
constexpr uint64_t kStreamNoiseCoin = 202;
constexpr uint64_t kStreamNoiseToken = 203;
}  // namespace

TokenFile::TokenFile(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  DPT_CHECK(fd >= 0, "token file '{}': cannot open: {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DPT_FAIL("token file '{}': not a regular file", path_);
  }
  const auto file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    DPT_FAIL("token file '{}': {} bytes, shorter than the {}-byte header (256 int32); truncated or not a token file",
             path_, file_bytes, kTokenFileHeaderBytes);
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  DPT_CHECK(map != MAP_FAILED, "token file '{}': mmap failed: {}", path_, std::strerror(errno));
  map_ = map;
  map_bytes_ = static_cast<size_t>(file_bytes);
  int32_t header[3];
  std::memcpy(header, map, sizeof(header));  // little-endian hosts only, like the format itself
  try {
    DPT_CHECK(header[0] == kTokenFileMagic, "token file '{}': bad magic number {} (expected {}); not a .bin token file",
              path_, header[0], kTokenFileMagic);
    DPT_CHECK(header[1] == kTokenFileVersion, "token file '{}': unsupported version {} (expected {}: uint16 tokens)",
              path_, header[1], kTokenFileVersion);
    DPT_CHECK(header[2] >= 0, "token file '{}': negative token count {} in the header", path_, header[2]);
    count_ = header[2];
    const int64_t expected = kTokenFileHeaderBytes + 2 * count_;
    DPT_CHECK(file_bytes >= expected,
              "token file '{}': truncated: the header declares {} tokens ({} bytes) but only {} bytes of tokens "
              "follow it",
              path_, count_, 2 * count_, file_bytes - kTokenFileHeaderBytes);
    DPT_CHECK(file_bytes == expected,
              "token file '{}': {} unexpected bytes after the {} tokens the header declares (file {} bytes, "
              "expected {})",
              path_, file_bytes - expected, count_, file_bytes, expected);
  } catch (...) {
    ::munmap(map_, map_bytes_);
    throw;
  }
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kTokenFileHeaderBytes);
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

uint16_t TokenFile::max_token() const {
  return count_ == 0 ? uint16_t{0} : *std::max_element(tokens_, tokens_ + count_);
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  DPT_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "write_token_file '{}': {} tokens exceed the int32 count",
            path, tokens.size());
  std::vector<int32_t> header(kTokenFileHeaderInts, 0);
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DPT_CHECK(out.good(), "write_token_file: cannot create '{}': {}", tmp, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(header.data()), kTokenFileHeaderBytes);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
    out.flush();
    if (!out.good()) {
      std::filesystem::remove(tmp);
      DPT_FAIL("write_token_file: writing '{}' failed (disk full?)", tmp);
    }
  }
  std::filesystem::rename(tmp, target);
}

std::vector<uint16_t> synthetic_tokens(int64_t count, int64_t vocab_size, uint64_t seed, double noise) {
  DPT_CHECK(count >= 0, "synthetic_tokens: count must be >= 0, got {}", count);
  DPT_CHECK(vocab_size >= 2 && vocab_size <= 65536, "synthetic_tokens: vocab_size must be in [2, 65536], got {}",
            vocab_size);
  const auto v = static_cast<uint64_t>(vocab_size);
  // A random affine map with `a` odd and coprime to most vocab sizes: a readable, learnable rule.
  const uint64_t a = 2 * random::below(seed, kStreamTransition, 0, v / 2 + 1) + 1;
  const uint64_t b = random::below(seed, kStreamTransition, 1, v);
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  uint64_t t = random::below(seed, kStreamNoiseToken, 0, v);
  for (int64_t i = 0; i < count; ++i) {
    const auto u = static_cast<uint64_t>(i);
    t = random::uniform(seed, kStreamNoiseCoin, u) < noise ? random::below(seed, kStreamNoiseToken, u + 1, v)
                                                           : (a * t + b) % v;
    tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(t);
  }
  return tokens;
}

bool ensure_synthetic_token_file(const std::string& path, int64_t count, int64_t vocab_size, uint64_t seed) {
  if (std::filesystem::exists(path)) {
    try {
      TokenFile existing(path);
      if (existing.size() == count && existing.max_token() < vocab_size) return false;
    } catch (const Error&) {
      // A damaged or different generated file is regenerated below.
    }
  }
  write_token_file(path, synthetic_tokens(count, vocab_size, seed));
  return true;
}

}  // namespace dpt::data
