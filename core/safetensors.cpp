#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <set>

#include "core/autograd.h"
#include "core/error.h"

namespace dpt {

namespace {

// --- a small strict JSON reader ----------------------------------------------------------------
// Enough JSON for a safetensors header: objects, arrays, strings and non-negative integers. Floats,
// negative numbers, true/false/null and duplicate keys are rejected: the header never needs them, and
// accepting them would only widen what a damaged file can smuggle in.
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

  Json parse_document() {
    skip_space();
    Json value = parse_value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected content after the top-level object");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 16;  // a header is 3 levels deep; deeper nesting is an attack

  [[noreturn]] void fail(const std::string& what) const {
    DPT_FAIL("safetensors file '{}': invalid header JSON at byte {}: {}", source_, pos_, what);
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

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& path, const std::string& name) {
  DPT_CHECK(b == 0 || a <= std::numeric_limits<uint64_t>::max() / b,
            "safetensors file '{}': tensor '{}': size overflows 64 bits", path, name);
  return a * b;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

const Json& member(const Json& obj, const char* key, Json::Kind kind, const std::string& path,
                   const std::string& name) {
  const Json* v = obj.find(key);
  DPT_CHECK(v != nullptr, "safetensors file '{}': tensor '{}' has no \"{}\"", path, name, key);
  DPT_CHECK(v->kind == kind, "safetensors file '{}': tensor '{}': \"{}\" must be {}, found {}", path, name, key,
            kind_name(kind), kind_name(v->kind));
  return *v;
}

Entry parse_entry(const std::string& name, const Json& value, const std::string& path) {
  DPT_CHECK(!name.empty(), "safetensors file '{}': empty tensor name", path);
  DPT_CHECK(value.kind == Json::Kind::Object, "safetensors file '{}': entry '{}' must be an object, found {}", path,
            name, kind_name(value.kind));
  for (const auto& [k, v] : value.members) {
    DPT_CHECK(k == "dtype" || k == "shape" || k == "data_offsets",
              "safetensors file '{}': tensor '{}' has unknown field \"{}\" (expected dtype, shape, data_offsets)",
              path, name, k);
  }
  Entry e;
  e.name = name;
  const std::string& dtype = member(value, "dtype", Json::Kind::String, path, name).text;
  if (!parse_safetensors_dtype(dtype, &e.dtype)) {
    DPT_CHECK(!is_known_safetensors_dtype(dtype),
              "safetensors file '{}': tensor '{}' has dtype {}, which dptrain cannot hold (expected F32, BF16, "
              "F16, F64, I32 or I64)", path, name, dtype);
    DPT_FAIL("safetensors file '{}': tensor '{}' has unknown dtype '{}' (expected F32, BF16, F16, F64, I32 or I64)", path,
             name, dtype);
  }
  for (const Json& d : member(value, "shape", Json::Kind::Array, path, name).items) {
    DPT_CHECK(d.kind == Json::Kind::Integer, "safetensors file '{}': tensor '{}': shape entries must be integers",
              path, name);
    DPT_CHECK(d.integer <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
              "safetensors file '{}': tensor '{}': extent {} too large", path, name, d.integer);
    e.shape.push_back(static_cast<int64_t>(d.integer));
  }
  const Json& offsets = member(value, "data_offsets", Json::Kind::Array, path, name);
  DPT_CHECK(offsets.items.size() == 2 && offsets.items[0].kind == Json::Kind::Integer &&
                offsets.items[1].kind == Json::Kind::Integer,
            "safetensors file '{}': tensor '{}': data_offsets must be [begin, end]", path, name);
  e.begin = offsets.items[0].integer;
  e.end = offsets.items[1].integer;
  DPT_CHECK(e.begin <= e.end, "safetensors file '{}': tensor '{}': data_offsets [{}, {}] end before they begin", path,
            name, e.begin, e.end);
  uint64_t bytes = dtype_size(e.dtype);
  for (int64_t d : e.shape) bytes = checked_mul(bytes, static_cast<uint64_t>(d), path, name);
  DPT_CHECK(e.end - e.begin == bytes,
            "safetensors file '{}': tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] span {}", path, name,
            dtype, shape_str(e.shape), bytes, e.begin, e.end, e.end - e.begin);
  return e;
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

void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  // 1. Order entries as the reference writer does: larger alignment first, then by name.
  std::vector<const std::pair<std::string, Tensor>*> order;
  std::set<std::string> names;
  for (const auto& entry : tensors) {
    DPT_CHECK(!entry.first.empty(), "save_safetensors '{}': empty tensor name", path);
    DPT_CHECK(entry.first != "__metadata__", "save_safetensors '{}': '__metadata__' is reserved", path);
    DPT_CHECK(names.insert(entry.first).second, "save_safetensors '{}': duplicate tensor name '{}'", path,
              entry.first);
    DPT_CHECK(entry.second.defined(), "save_safetensors '{}': tensor '{}' is undefined", path, entry.first);
    order.push_back(&entry);
  }
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    size_t sa = dtype_size(a->second.dtype()), sb = dtype_size(b->second.dtype());
    return sa != sb ? sa > sb : a->first < b->first;
  });

  // 2. Header JSON, padded with spaces to a multiple of 8 so the data starts aligned.
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

  // 3. Length, header, then each tensor's bytes (host, contiguous) straight into the temporary file.
  AtomicFile file(path);
  uint64_t n = header.size();
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  file.write(length, 8);
  file.write(header.data(), header.size());
  NoGradGuard no_grad;
  for (const auto* entry : order) {
    Tensor host = entry->second.detach().to(Device::cpu()).contiguous();
    file.write(host.data_ptr(), host.nbytes());
  }
  file.commit();
}

SafetensorsContents load_safetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DPT_CHECK(fd >= 0, "cannot open safetensors file '{}': {}", path, errno_text());
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  struct stat st {};
  DPT_CHECK(::fstat(fd, &st) == 0, "stat '{}': {}", path, errno_text());
  uint64_t file_size = static_cast<uint64_t>(st.st_size);

  // 1. Header length: present, sane, and inside the file.
  DPT_CHECK(file_size >= 8, "safetensors file '{}' is {} bytes, too short for the 8-byte header length", path,
            file_size);
  unsigned char length[8];
  read_all(fd, length, 8, 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  DPT_CHECK(n <= kSafetensorsMaxHeaderBytes, "safetensors file '{}': header length {} exceeds the {}-byte limit", path,
            n, kSafetensorsMaxHeaderBytes);
  DPT_CHECK(n <= file_size - 8, "safetensors file '{}': header length {} runs past the end of the {}-byte file", path,
            n, file_size);
  std::string header(n, '\0');
  read_all(fd, header.data(), n, 8, path);
  DPT_CHECK(n > 0 && header[0] == '{', "safetensors file '{}': header must start with '{{'", path);

  // 2. JSON -> entries, each self-consistent (dtype known, size = numel * element size).
  Json root = JsonParser(header, path).parse_document();
  DPT_CHECK(root.kind == Json::Kind::Object, "safetensors file '{}': header must be a JSON object", path);
  SafetensorsContents contents;
  std::vector<Entry> entries;
  for (const auto& [name, value] : root.members) {
    if (name == "__metadata__") {
      DPT_CHECK(value.kind == Json::Kind::Object, "safetensors file '{}': __metadata__ must be an object", path);
      for (const auto& [k, v] : value.members) {
        DPT_CHECK(v.kind == Json::Kind::String, "safetensors file '{}': __metadata__ value of '{}' must be a string",
                  path, k);
        contents.metadata[k] = v.text;
      }
      continue;
    }
    entries.push_back(parse_entry(name, value, path));
  }

  // 3. The entries tile the data region exactly: sorted by begin, each starts where the last ended.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const Entry& e : entries) {
    DPT_CHECK(e.begin >= expected, "safetensors file '{}': tensor '{}' data [{}, {}) overlaps the previous tensor "
              "(which ends at {})", path, e.name, e.begin, e.end, expected);
    DPT_CHECK(e.begin == expected, "safetensors file '{}': hole in the data: tensor '{}' begins at {} but the previous "
              "tensor ends at {}", path, e.name, e.begin, expected);
    expected = e.end;
  }
  uint64_t data_size = file_size - 8 - n;
  DPT_CHECK(expected == data_size, "safetensors file '{}': tensors cover {} data bytes but the file holds {} (file "
            "size {}; {})", path, expected, data_size, file_size,
            expected > data_size ? "truncated" : "trailing bytes");

  // 4. Read each tensor's bytes into its own CPU tensor.
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, TensorOptions{}.with_dtype(e.dtype));
    read_all(fd, t.data_ptr(), e.end - e.begin, 8 + n + e.begin, path);
    contents.tensors.emplace_back(e.name, std::move(t));
  }
  return contents;
}

}  // namespace dpt
