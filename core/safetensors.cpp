#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <memory>
#include <set>

#include "core/autograd.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/regular_file.h"

namespace dpt {

namespace {

// --- a small strict JSON reader ----------------------------------------------------------------
// Enough JSON for a safetensors header: objects, arrays, strings and non-negative integers. Floats,
// negative numbers, true/false/null and duplicate keys are rejected: the header never needs them, and
// accepting them would only widen what a damaged file can smuggle in.
// Memory: a parsed node is ~100 bytes however short its text ("0," is two), so every container is
// bounded as it is read: an array holds at most kSafetensorsMaxRank items (a shape; data_offsets has 2)
// and a tensor's entry a few fields; the top-level object is handed out member by member
// (parse_members), so only one entry's tree exists at a time, and __metadata__ goes straight into its
// string map. What the reader keeps is then a small multiple of the header's length.
struct JsonMember;
struct Json {
  enum class Kind { Object, Array, String, Integer };
  Kind kind = Kind::Object;
  // A named struct rather than std::pair<std::string, Json>: with libstdc++, clang cannot instantiate
  // a pair of the type being defined (its conditionally explicit constructor asks whether Json is
  // default-constructible while Json is still incomplete).
  std::vector<JsonMember> members;  // Object, in file order
  std::vector<Json> items;                            // Array
  std::string text;                                   // String
  uint64_t integer = 0;                               // Integer

  const Json* find(const std::string& key) const;
};

struct JsonMember {
  std::string key;
  Json value;
};

const Json* Json::find(const std::string& key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

const char* kind_name(Json::Kind kind) {
  switch (kind) {
    case Json::Kind::Object: return "an object";
    case Json::Kind::Array: return "an array";
    case Json::Kind::String: return "a string";
    case Json::Kind::Integer: return "an integer";
  }
  return "?";
}

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  // Calls on_entry(key, value) for each member of the top-level object but __metadata__, in file order
  // (at most `max_entries` of them), and stores __metadata__'s members in `metadata` (at most
  // kSafetensorsMaxMetadata; each value must be a string).
  template <class F>
  void parse_members(size_t max_entries, SafetensorsMetadata& metadata, F&& on_entry) {
    skip_space();
    std::set<std::string> seen;
    size_t entries = 0;
    for_each_member([&](std::string key) {
      if (!seen.insert(key).second) fail(fmt::format("duplicate key '{}'", key));
      if (key == "__metadata__") return parse_metadata(metadata);
      if (++entries > max_entries) fail(fmt::format("more than {} tensors", max_entries));
      on_entry(key, parse_value(1));
    });
    skip_space();
    if (pos_ != s_.size()) fail("unexpected content after the top-level object");
  }

 private:
  static constexpr int kMaxDepth = 16;  // a header is 3 levels deep; deeper nesting is an attack
  static constexpr size_t kMaxFields = 8;  // members of a nested object (a tensor's entry has 3)

  // Reads `{ "key": <value>, ... }`, calling on_key(key) with the position on the value, which it must
  // consume.
  template <class F>
  void for_each_member(F&& on_key) {
    expect('{');
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      on_key(std::move(key));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return;
    }
  }

  void parse_metadata(SafetensorsMetadata& metadata) {
    if (peek() != '{') throw DamagedFile(fmt::format("safetensors file '{}': __metadata__ must be an object", source_));
    for_each_member([&](std::string key) {
      if (peek() != '"') {
        throw DamagedFile(
            fmt::format("safetensors file '{}': __metadata__ value of '{}' must be a string", source_, key));
      }
      std::string value = parse_string();
      if (metadata.size() == kSafetensorsMaxMetadata) {
        fail(fmt::format("__metadata__ has more than {} entries", kSafetensorsMaxMetadata));
      }
      if (!metadata.emplace(std::move(key), std::move(value)).second) fail("duplicate key in __metadata__");
    });
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw DamagedFile(fmt::format("safetensors file '{}': invalid header JSON at byte {}: {}", source_, pos_, what));
  }

  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }

  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }

  void expect(char c) {
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++pos_;
  }

  Json parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      Json j;
      j.kind = Json::Kind::String;
      j.text = parse_string();
      return j;
    }
    if (c >= '0' && c <= '9') return parse_integer();
    if (c == '-') fail("negative numbers are not allowed in a safetensors header");
    if (pos_ >= s_.size()) fail("unexpected end of header");
    fail(fmt::format("unexpected character '{}'", c));
  }

  Json parse_object(int depth) {
    Json j;
    j.kind = Json::Kind::Object;
    expect('{');
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return j;
    }
    std::set<std::string> seen;
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      if (!seen.insert(key).second) fail(fmt::format("duplicate key '{}'", key));
      if (seen.size() > kMaxFields) fail(fmt::format("an object of more than {} members", kMaxFields));
      skip_space();
      expect(':');
      skip_space();
      Json value = parse_value(depth + 1);
      j.members.push_back(JsonMember{std::move(key), std::move(value)});
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return j;
    }
  }

  Json parse_array(int depth) {
    Json j;
    j.kind = Json::Kind::Array;
    expect('[');
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return j;
    }
    while (true) {
      skip_space();
      if (j.items.size() == kSafetensorsMaxRank) {
        fail(fmt::format("an array of more than {} items (a tensor has at most {} dimensions)", kSafetensorsMaxRank,
                         kSafetensorsMaxRank));
      }
      j.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return j;
    }
  }

  Json parse_integer() {
    Json j;
    j.kind = Json::Kind::Integer;
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      uint64_t digit = static_cast<uint64_t>(s_[pos_] - '0');
      if (j.integer > (std::numeric_limits<uint64_t>::max() - digit) / 10) fail("integer overflows 64 bits");
      j.integer = j.integer * 10 + digit;
      ++pos_;
    }
    if (pos_ - start > 1 && s_[start] == '0') fail("leading zeros are not allowed");
    char c = peek();
    if (c == '.' || c == 'e' || c == 'E') fail("only integers are allowed in a safetensors header");
    return j;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair encodes one code point above U+FFFF
            if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') fail("lone high surrogate");
            pos_ += 2;
            uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(fmt::format("bad escape '\\{}'", e));
      }
    }
  }

  const std::string& s_;
  const std::string& source_;
  size_t pos_ = 0;
};

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// --- dtypes -----------------------------------------------------------------------------------------

bool parse_safetensors_dtype(const std::string& name, DType* out) {
  if (name == "F32") *out = DType::Float32;
  else if (name == "BF16") *out = DType::BFloat16;
  else if (name == "F16") *out = DType::Float16;
  else if (name == "F64") *out = DType::Float64;
  else if (name == "I32") *out = DType::Int32;
  else if (name == "I64") *out = DType::Int64;
  else return false;
  return true;
}

bool is_known_safetensors_dtype(const std::string& name) {
  static const std::set<std::string> kAll = {"BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32",
                                             "U32",  "F32", "F64", "I64", "U64", "F8_E4M3", "F8_E5M2"};
  return kAll.count(name) > 0;
}

// --- file helpers ---------------------------------------------------------------------------------

// A check whose failure the file's own bytes prove (damage), as opposed to a failure to read them.
#define DPT_DAMAGED_CHECK(cond, ...)                                 \
  do {                                                               \
    if (!(cond)) throw ::dpt::DamagedFile(fmt::format(__VA_ARGS__)); \
  } while (0)

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    DPT_CHECK(w > 0, "writing '{}': {}", path, errno_text());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    DPT_CHECK(r >= 0, "reading '{}': {}", path, errno_text());
    DPT_CHECK(r > 0, "reading '{}': file ended early (truncated?)", path);
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

std::string directory_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A temporary file beside the destination that becomes it on commit(), or disappears if never
// committed (the destructor removes it), so an exception mid-write leaves the old file untouched.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path) {
    static std::atomic<uint64_t> counter{0};
    temp_ = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    DPT_CHECK(fd_ >= 0, "cannot create '{}' (to write '{}' atomically): {}", temp_, path, errno_text());
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n) { write_all(fd_, data, n, temp_); }

  // Rewrites bytes already written (the header once the checksums are known).
  void write_at(uint64_t offset, const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      DPT_CHECK(w > 0, "writing '{}': {}", temp_, errno_text());
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
  }

  void commit() {
    // 1. The data reaches the disk before the name points at it...
    DPT_CHECK(::fsync(fd_) == 0, "fsync '{}': {}", temp_, errno_text());
    int fd = fd_;
    fd_ = -1;
    DPT_CHECK(::close(fd) == 0, "close '{}': {}", temp_, errno_text());
    // 2. ...then the rename swaps old for new in one step...
    DPT_CHECK(::rename(temp_.c_str(), path_.c_str()) == 0, "rename '{}' -> '{}': {}", temp_, path_, errno_text());
    committed_ = true;
    // 3. ...and syncing the directory makes the rename itself durable.
    std::string dir = directory_of(path_);
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DPT_CHECK(dfd >= 0, "open directory '{}': {}", dir, errno_text());
    int rc = ::fsync(dfd);
    ::close(dfd);
    DPT_CHECK(rc == 0, "fsync directory '{}': {}", dir, errno_text());
  }

 private:
  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

const Json& member(const Json& obj, const char* key, Json::Kind kind, const std::string& path,
                   const std::string& name) {
  const Json* v = obj.find(key);
  DPT_DAMAGED_CHECK(v != nullptr, "safetensors file '{}': tensor '{}' has no \"{}\"", path, name, key);
  DPT_DAMAGED_CHECK(v->kind == kind, "safetensors file '{}': tensor '{}': \"{}\" must be {}, found {}", path, name, key,
                    kind_name(kind), kind_name(v->kind));
  return *v;
}

// The bytes a tensor of `shape` holds. Every extent is at most int64's maximum, and so is the product
// of the non-zero extents times the element size: a zero extent makes the tensor empty, but the other
// extents still multiply into its strides (core/shape.h), which must not overflow either.
uint64_t tensor_bytes(const Shape& shape, DType dtype, const std::string& path, const std::string& name) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t span = dtype_size(dtype);
  bool empty = false;
  for (int64_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    DPT_DAMAGED_CHECK(!__builtin_mul_overflow(span, static_cast<uint64_t>(d), &span) && span <= kMax,
                      "safetensors file '{}': tensor '{}': shape {} overflows 64 bits", path, name, shape_str(shape));
  }
  return empty ? 0 : span;
}

Entry parse_entry(const std::string& name, const Json& value, const std::string& path) {
  DPT_DAMAGED_CHECK(!name.empty(), "safetensors file '{}': empty tensor name", path);
  DPT_DAMAGED_CHECK(value.kind == Json::Kind::Object, "safetensors file '{}': entry '{}' must be an object, found {}",
                    path, name, kind_name(value.kind));
  for (const auto& [k, v] : value.members) {
    DPT_DAMAGED_CHECK(k == "dtype" || k == "shape" || k == "data_offsets",
                      "safetensors file '{}': tensor '{}' has unknown field \"{}\" (expected dtype, shape, "
                      "data_offsets)",
                      path, name, k);
  }
  Entry e;
  e.name = name;
  const std::string& dtype = member(value, "dtype", Json::Kind::String, path, name).text;
  if (!parse_safetensors_dtype(dtype, &e.dtype)) {
    DPT_DAMAGED_CHECK(!is_known_safetensors_dtype(dtype),
                      "safetensors file '{}': tensor '{}' has dtype {}, which dptrain cannot hold (expected F32, "
                      "BF16, F16, F64, I32 or I64)",
                      path, name, dtype);
    throw DamagedFile(fmt::format(
        "safetensors file '{}': tensor '{}' has unknown dtype '{}' (expected F32, BF16, F16, F64, I32 or I64)", path,
        name, dtype));
  }
  // The parser has already bounded the rank (kSafetensorsMaxRank).
  for (const Json& d : member(value, "shape", Json::Kind::Array, path, name).items) {
    DPT_DAMAGED_CHECK(d.kind == Json::Kind::Integer,
                      "safetensors file '{}': tensor '{}': shape entries must be integers", path, name);
    DPT_DAMAGED_CHECK(d.integer <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                      "safetensors file '{}': tensor '{}': extent {} too large", path, name, d.integer);
    e.shape.push_back(static_cast<int64_t>(d.integer));
  }
  const Json& offsets = member(value, "data_offsets", Json::Kind::Array, path, name);
  DPT_DAMAGED_CHECK(offsets.items.size() == 2 && offsets.items[0].kind == Json::Kind::Integer &&
                        offsets.items[1].kind == Json::Kind::Integer,
                    "safetensors file '{}': tensor '{}': data_offsets must be [begin, end]", path, name);
  e.begin = offsets.items[0].integer;
  e.end = offsets.items[1].integer;
  DPT_DAMAGED_CHECK(e.begin <= e.end, "safetensors file '{}': tensor '{}': data_offsets [{}, {}] end before they begin",
                    path, name, e.begin, e.end);
  const uint64_t bytes = tensor_bytes(e.shape, e.dtype, path, name);
  DPT_DAMAGED_CHECK(e.end - e.begin == bytes,
                    "safetensors file '{}': tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] span {}", path,
                    name, dtype, shape_str(e.shape), bytes, e.begin, e.end, e.end - e.begin);
  return e;
}

std::string checksum_text(uint32_t crc) { return fmt::format("{:08x}", crc); }

bool is_checksum_key(const std::string& key) {
  return key.compare(0, std::strlen(kSafetensorsChecksumPrefix), kSafetensorsChecksumPrefix) == 0;
}

// The stored checksum of each tensor (taken out of `metadata`), every one of them well formed and
// naming a tensor of the file.
std::map<std::string, uint32_t> take_checksums(SafetensorsMetadata& metadata, const std::vector<Entry>& entries,
                                               const std::string& path) {
  std::set<std::string> names;
  for (const Entry& e : entries) names.insert(e.name);
  std::map<std::string, uint32_t> out;
  const size_t prefix = std::strlen(kSafetensorsChecksumPrefix);
  for (auto it = metadata.begin(); it != metadata.end();) {
    if (!is_checksum_key(it->first)) {
      ++it;
      continue;
    }
    const std::string name = it->first.substr(prefix);
    const std::string& text = it->second;
    uint32_t crc = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), crc, 16);
    DPT_DAMAGED_CHECK(text.size() == 8 && ec == std::errc() && end == text.data() + text.size(),
                      "safetensors file '{}': checksum of tensor '{}' is '{}', not 8 hex digits", path, name, text);
    DPT_DAMAGED_CHECK(names.count(name), "safetensors file '{}': a checksum names tensor '{}', which the file lacks",
                      path, name);
    out[name] = crc;
    it = metadata.erase(it);
  }
  // The writer stores all of them or none: a file with some is missing the others.
  for (const Entry& e : entries) {
    DPT_DAMAGED_CHECK(out.empty() || out.count(e.name),
                      "safetensors file '{}': tensor '{}' has no checksum but {} others do", path, e.name, out.size());
  }
  return out;
}

}  // namespace

bool SafetensorsContents::contains(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

const Tensor& SafetensorsContents::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  DPT_FAIL("safetensors: no tensor named '{}' ({} tensors present)", name, tensors.size());
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "F32";
    case DType::BFloat16: return "BF16";
    case DType::Float16: return "F16";
    case DType::Float64: return "F64";
    case DType::Int32: return "I32";
    case DType::Int64: return "I64";
  }
  return "?";
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

namespace {

// The header JSON, padded with spaces to a multiple of 8 so the data starts aligned. Its length does not
// depend on the checksums' values (8 hex digits each), so it can be written before they are known.
std::string header_json(const std::vector<const std::pair<std::string, Tensor>*>& order,
                        const SafetensorsMetadata& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ',';
      header += json_quote(k);
      header += ':';
      header += json_quote(v);
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto* entry : order) {
    const Tensor& t = entry->second;
    if (header.size() > 1) header += ",";
    header += json_quote(entry->first);
    header += ":{\"dtype\":\"";
    header += safetensors_dtype_name(t.dtype());
    header += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape().size(); ++i) {
      if (i) header += ',';
      header += std::to_string(t.shape()[i]);
    }
    uint64_t end = offset + t.nbytes();
    header += fmt::format("],\"data_offsets\":[{},{}]}}", offset, end);
    offset = end;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  return header;
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  // 1. Order entries as the reference writer does: larger alignment first, then by name.
  std::vector<const std::pair<std::string, Tensor>*> order;
  std::set<std::string> names;
  for (const auto& entry : tensors) {
    DPT_CHECK(!entry.first.empty(), "save_safetensors '{}': empty tensor name", path);
    DPT_CHECK(entry.first != "__metadata__", "save_safetensors '{}': '__metadata__' is reserved", path);
    DPT_CHECK(names.insert(entry.first).second, "save_safetensors '{}': duplicate tensor name '{}'", path, entry.first);
    DPT_CHECK(entry.second.defined(), "save_safetensors '{}': tensor '{}' is undefined", path, entry.first);
    DPT_CHECK(entry.second.dim() <= static_cast<int64_t>(kSafetensorsMaxRank),
              "save_safetensors '{}': tensor '{}' has {} dimensions; a file holds at most {}", path, entry.first,
              entry.second.dim(), kSafetensorsMaxRank);
    order.push_back(&entry);
  }
  DPT_CHECK(order.size() <= kSafetensorsMaxTensors, "save_safetensors '{}': {} tensors; a file holds at most {}", path,
            order.size(), kSafetensorsMaxTensors);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    size_t sa = dtype_size(a->second.dtype()), sb = dtype_size(b->second.dtype());
    return sa != sb ? sa > sb : a->first < b->first;
  });

  // 2. Header, with a placeholder checksum per tensor (filled in by step 4).
  SafetensorsMetadata meta;
  for (const auto& [k, v] : metadata) {
    DPT_CHECK(!is_checksum_key(k), "save_safetensors '{}': metadata key '{}' is reserved for checksums", path, k);
    meta[k] = v;
  }
  for (const auto* entry : order) meta[kSafetensorsChecksumPrefix + entry->first] = checksum_text(0);
  DPT_CHECK(meta.size() <= kSafetensorsMaxMetadata, "save_safetensors '{}': {} metadata entries; at most {}", path,
            meta.size(), kSafetensorsMaxMetadata);
  std::string header = header_json(order, meta);
  DPT_CHECK(header.size() <= kSafetensorsMaxHeaderBytes, "save_safetensors '{}': the header is {} bytes; at most {}",
            path, header.size(), kSafetensorsMaxHeaderBytes);

  // 3. Length, header, then each tensor's bytes (host, contiguous) straight into the temporary file,
  // checksummed as they go out.
  AtomicFile file(path);
  uint64_t n = header.size();
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  file.write(length, 8);
  file.write(header.data(), header.size());
  NoGradGuard no_grad;
  for (const auto* entry : order) {
    Tensor host = entry->second.detach().to(Device::cpu()).contiguous();
    meta[kSafetensorsChecksumPrefix + entry->first] = checksum_text(crc32c(host.data_ptr(), host.nbytes()));
    file.write(host.data_ptr(), host.nbytes());
  }
  // 4. The header again, now with the checksums (same length: fixed-width values).
  const std::string final_header = header_json(order, meta);
  DPT_CHECK(final_header.size() == header.size(), "save_safetensors '{}': header length changed ({} -> {})", path,
            header.size(), final_header.size());
  file.write_at(8, final_header.data(), final_header.size());
  file.commit();
}

SafetensorsContents load_safetensors(const std::string& path) {
  const RegularFile opened = open_regular_file(path, "safetensors file");
  int fd = opened.fd;
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  uint64_t file_size = static_cast<uint64_t>(opened.size);

  // 1. Header length: present, sane, and inside the file.
  DPT_DAMAGED_CHECK(file_size >= 8, "safetensors file '{}' is {} bytes, too short for the 8-byte header length", path,
                    file_size);
  unsigned char length[8];
  read_all(fd, length, 8, 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  DPT_DAMAGED_CHECK(n <= kSafetensorsMaxHeaderBytes,
                    "safetensors file '{}': header length {} exceeds the {}-byte limit", path, n,
                    kSafetensorsMaxHeaderBytes);
  DPT_DAMAGED_CHECK(n <= file_size - 8, "safetensors file '{}': header length {} runs past the end of the {}-byte file",
                    path, n, file_size);
  std::string header(n, '\0');
  read_all(fd, header.data(), n, 8, path);
  DPT_DAMAGED_CHECK(n > 0 && header[0] == '{', "safetensors file '{}': header must start with '{{'", path);

  // 2. JSON -> entries, each self-consistent (dtype known, size = numel * element size), one at a time.
  SafetensorsContents contents;
  std::vector<Entry> entries;
  JsonParser(header, path)
      .parse_members(kSafetensorsMaxTensors, contents.metadata, [&](const std::string& name, const Json& value) {
        entries.push_back(parse_entry(name, value, path));
      });
  const std::map<std::string, uint32_t> checksums = take_checksums(contents.metadata, entries, path);
  contents.checksummed = entries.empty() || !checksums.empty();

  // 3. The entries tile the data region exactly: sorted by begin, each starts where the last ended.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const Entry& e : entries) {
    DPT_DAMAGED_CHECK(e.begin >= expected,
                      "safetensors file '{}': tensor '{}' data [{}, {}) overlaps the previous tensor (which ends at "
                      "{})",
                      path, e.name, e.begin, e.end, expected);
    DPT_DAMAGED_CHECK(e.begin == expected,
                      "safetensors file '{}': hole in the data: tensor '{}' begins at {} but the previous tensor "
                      "ends at {}",
                      path, e.name, e.begin, expected);
    expected = e.end;
  }
  uint64_t data_size = file_size - 8 - n;
  DPT_DAMAGED_CHECK(expected == data_size,
                    "safetensors file '{}': tensors cover {} data bytes but the file holds {} (file size {}; {})", path,
                    expected, data_size, file_size, expected > data_size ? "truncated" : "trailing bytes");

  // 4. Read each tensor's bytes into its own CPU tensor, checking its checksum when the file has them.
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, TensorOptions{}.with_dtype(e.dtype));
    read_all(fd, t.data_ptr(), e.end - e.begin, 8 + n + e.begin, path);
    if (auto it = checksums.find(e.name); it != checksums.end()) {
      const uint32_t actual = crc32c(t.data_ptr(), e.end - e.begin);
      DPT_DAMAGED_CHECK(actual == it->second,
                        "safetensors file '{}': tensor '{}' fails its checksum (CRC32C {} stored, {} computed): its "
                        "bytes changed after they were written",
                        path, e.name, checksum_text(it->second), checksum_text(actual));
    }
    contents.tensors.emplace_back(e.name, std::move(t));
  }
  return contents;
}

}  // namespace dpt
