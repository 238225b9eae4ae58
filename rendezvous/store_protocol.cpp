#include "rendezvous/store_protocol.h"

#include <spdlog/fmt/fmt.h>

#include <cstring>

namespace dpt::dist::store_wire {
namespace {

// Reads fields off the front of a buffer. Each getter returns false when the buffer ends first; a
// length or count beyond its bound marks the message invalid before anything is allocated for it.
class Cursor {
 public:
  Cursor(std::string_view bytes, ParseResult& result) : bytes_(bytes), result_(result) {}

  template <class T>
  bool pod(T& v) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  bool str(std::string& s, size_t max, const char* what) {
    uint32_t n = 0;
    size_t start = pos_;
    if (!pod(n)) return false;
    if (n > max) return invalid(fmt::format("{} of {} bytes (at most {})", what, n, max));
    if (pos_ + n > kMaxRequestBytes) return invalid(fmt::format("a request over {} bytes", kMaxRequestBytes));
    if (bytes_.size() - pos_ < n) {
      pos_ = start;
      return false;
    }
    s.assign(bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }

  bool invalid(std::string why) {
    result_.state = Parsed::Invalid;
    result_.why = std::move(why);
    return false;
  }

  ParseResult& complete() {
    result_.state = Parsed::Complete;
    result_.used = pos_;
    return result_;
  }

 private:
  std::string_view bytes_;
  ParseResult& result_;
  size_t pos_ = 0;
};

bool valid_timeout(Cursor& in, int64_t ms) {
  if (ms >= 0 && ms <= kMaxWaitMs) return true;
  return in.invalid(fmt::format("a timeout of {} ms (must be in [0, {}])", ms, kMaxWaitMs));
}

}  // namespace

ParseResult parse_hello(std::string_view bytes, Hello& out) {
  ParseResult r;
  Cursor in(bytes, r);
  uint32_t magic = 0, version = 0;
  if (!in.pod(magic)) return r;
  if (magic != kMagic) {
    in.invalid("not a dptrain store client (wrong greeting)");
    return r;
  }
  if (!in.pod(version)) return r;
  if (version != kVersion) {
    in.invalid(fmt::format("store protocol version {} (this store speaks {})", version, kVersion));
    return r;
  }
  if (!in.str(out.job_id, kMaxJobIdBytes, "a job id")) return r;
  if (!in.pod(out.rank) || !in.pod(out.world_size)) return r;
  if (out.world_size < 1 || out.rank < 0 || out.rank >= out.world_size) {
    in.invalid(fmt::format("rank {} of a world of {}", out.rank, out.world_size));
    return r;
  }
  return in.complete();
}

ParseResult parse_request(std::string_view bytes, Request& out) {
  ParseResult r;
  Cursor in(bytes, r);
  uint8_t command = 0;
  if (!in.pod(command)) return r;
  out.command = static_cast<Command>(command);
  out.keys.clear();
  out.value.clear();
  out.number = 0;
  auto one_key = [&] {
    out.keys.emplace_back();
    return in.str(out.keys.back(), kMaxKeyBytes, "a key");
  };
  switch (out.command) {
    case Command::Set:
      if (!one_key() || !in.str(out.value, kMaxValueBytes, "a value")) return r;
      break;
    case Command::Get:
      if (!one_key() || !in.pod(out.number) || !valid_timeout(in, out.number)) return r;
      break;
    case Command::Add:
      if (!one_key() || !in.pod(out.number)) return r;
      break;
    case Command::Remove:
      if (!one_key()) return r;
      break;
    case Command::Check:
    case Command::Wait: {
      uint32_t n = 0;
      if (!in.pod(n)) return r;
      if (n > kMaxKeysPerRequest) {
        in.invalid(fmt::format("{} keys in one request (at most {})", n, kMaxKeysPerRequest));
        return r;
      }
      // Keys are kept as they arrive, never reserved by the peer's count.
      for (uint32_t i = 0; i < n; ++i)
        if (!one_key()) return r;
      if (out.command == Command::Wait && (!in.pod(out.number) || !valid_timeout(in, out.number))) return r;
      break;
    }
    default:
      in.invalid(fmt::format("unknown command {}", command));
      return r;
  }
  return in.complete();
}

void put_u8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_i32(std::string& out, int32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_i64(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_str(std::string& out, std::string_view s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.append(s.data(), s.size());
}

std::string encode_hello(const Hello& hello) {
  std::string out;
  put_u32(out, kMagic);
  put_u32(out, kVersion);
  put_str(out, hello.job_id);
  put_i32(out, hello.rank);
  put_i32(out, hello.world_size);
  return out;
}

std::string encode_request(const Request& request) {
  std::string out;
  put_u8(out, static_cast<uint8_t>(request.command));
  switch (request.command) {
    case Command::Set:
      put_str(out, request.keys.at(0));
      put_str(out, request.value);
      break;
    case Command::Get:
    case Command::Add:
      put_str(out, request.keys.at(0));
      put_i64(out, request.number);
      break;
    case Command::Remove:
      put_str(out, request.keys.at(0));
      break;
    case Command::Check:
    case Command::Wait:
      put_u32(out, static_cast<uint32_t>(request.keys.size()));
      for (const auto& k : request.keys) put_str(out, k);
      if (request.command == Command::Wait) put_i64(out, request.number);
      break;
  }
  return out;
}

}  // namespace dpt::dist::store_wire
