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
#include "core/regular_file.h"
#include "data/counter_random.h"

namespace dpt::data {

namespace {
constexpr uint64_t kStreamTransition = 201;
constexpr uint64_t kStreamNoiseCoin = 202;
constexpr uint64_t kStreamNoiseToken = 203;

// A synthetic token file says so in the header's reserved ints, which readers of the format ignore:
// [3] this marker, [4] the generator's version, [5] vocab size, [6] [7] the seed's low and high halves.
// Only a file carrying it, or one whose tokens are exactly what the generator makes, is ever rewritten.
constexpr int32_t kSyntheticMarker = 0x53545044;  // "DPTS" in the file's little-endian bytes
constexpr int32_t kSyntheticVersion = 1;

void write_tokens(const std::string& path, const std::vector<uint16_t>& tokens, const std::vector<int32_t>& reserved) {
  DPT_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "write_token_file '{}': {} tokens exceed the int32 count",
            path, tokens.size());
  std::vector<int32_t> header(kTokenFileHeaderInts, 0);
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::copy(reserved.begin(), reserved.end(), header.begin() + 3);
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

std::vector<int32_t> synthetic_header(int64_t vocab_size, uint64_t seed) {
  return {kSyntheticMarker, kSyntheticVersion, static_cast<int32_t>(vocab_size),
          static_cast<int32_t>(static_cast<uint32_t>(seed)), static_cast<int32_t>(static_cast<uint32_t>(seed >> 32))};
}

// The first header ints of `path` (fewer when the file is shorter), read without blocking; throws naming
// the path when it cannot be read or is not a regular file.
std::vector<int32_t> read_header_ints(const std::string& path, size_t count) {
  const int fd = open_regular_file(path, "file").fd;
  std::vector<int32_t> ints(count, 0);
  const ssize_t got = ::pread(fd, ints.data(), count * sizeof(int32_t), 0);
  const int err = errno;
  ::close(fd);
  DPT_CHECK(got >= 0, "'{}': cannot read: {}", path, std::strerror(err));
  ints.resize(static_cast<size_t>(got) / sizeof(int32_t));
  return ints;
}
}  // namespace

TokenFile::TokenFile(std::string path) : path_(std::move(path)) {
  const RegularFile opened = open_regular_file(path_, "token file");
  const int fd = opened.fd;
  const int64_t file_bytes = opened.size;
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

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) { write_tokens(path, tokens, {}); }

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
  const std::vector<int32_t> ours = synthetic_header(vocab_size, seed);
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    write_tokens(path, synthetic_tokens(count, vocab_size, seed), ours);
    return true;
  }
  const std::vector<int32_t> header = read_header_ints(path, 3 + ours.size());
  const bool token_header = header.size() >= 3 && header[0] == kTokenFileMagic && header[1] == kTokenFileVersion;
  const bool marked = token_header && header.size() == 3 + ours.size() && header[3] == kSyntheticMarker;
  if (marked) {
    // Generated here before: kept when it is this very corpus and intact, else regenerated.
    const bool same = std::equal(ours.begin(), ours.end(), header.begin() + 3) && header[2] == count;
    if (same) {
      try {
        if (TokenFile(path).size() == count) return false;
      } catch (const Error&) {
        // Damaged: it is ours, so it is written anew below.
      }
    }
    write_tokens(path, synthetic_tokens(count, vocab_size, seed), ours);
    return true;
  }
  // A file without the marker is kept only when it already holds exactly this corpus (a file generated
  // before the marker existed); anything else is somebody's data.
  std::string what = "not a token file";
  if (token_header) {
    TokenFile existing(path);
    const std::vector<uint16_t> expected = synthetic_tokens(count, vocab_size, seed);
    if (existing.size() == count && std::equal(expected.begin(), expected.end(), existing.tokens())) return false;
    what = fmt::format("a token file of {} tokens", existing.size());
  }
  DPT_FAIL(
      "'{}' exists and was not written by synthetic_tokens ({}); it is never overwritten. Point the path "
      "elsewhere or remove the file",
      path, what);
}

}  // namespace dpt::data
