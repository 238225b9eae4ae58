#pragma once
// The TCP store's wire format, shared by its server (tcp_store_server.cpp), its client (tcp_store.cpp)
// and the fuzz target (fuzz/store_fuzz.cpp).
//
// Native byte order: all ranks of a job share an architecture. A connection opens with the client's
// hello (magic, protocol version, job id, rank, world size); the server answers with its magic, a
// HelloStatus and a message, and serves requests only after a welcome. A request is a one-byte
// Command and its fields; strings are a uint32 length and the bytes. Every reply starts with a Status.
//
// Nothing a peer sends is trusted: each length, count and timeout is checked against the bounds below
// before anything is allocated for it, and a message that breaks one is invalid (the server drops the
// connection and logs the peer's address; the client fails naming the store).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dpt::dist::store_wire {

inline constexpr uint32_t kMagic = 0x53545044;  // "DPTS" in little-endian memory
inline constexpr uint32_t kVersion = 1;

// Keys are short paths. The largest values are Gloo's per-rank address lists (about 140 bytes per peer)
// and DDP's parameter list, far below kMaxValueBytes. A wait names at most one key per rank.
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = size_t{64} << 20;
inline constexpr size_t kMaxKeysPerRequest = 65536;
inline constexpr size_t kMaxJobIdBytes = 256;
inline constexpr size_t kMaxMessageBytes = 4096;  // the server's refusals and error replies
inline constexpr int64_t kMaxWaitMs = int64_t{30} * 24 * 3600 * 1000;
// The largest request: a set of the largest value. A wait's keys together are held to the same size.
inline constexpr size_t kMaxRequestBytes = 1 + 4 + kMaxKeyBytes + 4 + kMaxValueBytes;
inline constexpr size_t kHelloBytesMax = 4 + 4 + 4 + kMaxJobIdBytes + 4 + 4;

enum class Command : uint8_t { Set = 1, Get = 2, Add = 3, Check = 4, Wait = 5, Remove = 6 };
enum class Status : uint8_t {
  Ok = 0,
  TimedOut = 1,      // get/wait: keys still missing at the deadline (listed)
  ShuttingDown = 2,  // the hosting rank is exiting; keys still missing are listed
  Error = 3,         // the request was refused; a message follows
};
enum class HelloStatus : uint8_t { Welcome = 0, OtherJob = 1, Busy = 2 };

struct Hello {
  std::string job_id;
  int32_t rank = 0;
  int32_t world_size = 1;
};

// Set: keys[0], value. Get: keys[0], number = timeout ms. Add: keys[0], number = delta.
// Check: keys. Wait: keys, number = timeout ms. Remove: keys[0].
struct Request {
  Command command = Command::Set;
  std::vector<std::string> keys;
  std::string value;
  int64_t number = 0;
};

enum class Parsed { Incomplete, Complete, Invalid };
struct ParseResult {
  Parsed state = Parsed::Incomplete;
  size_t used = 0;  // bytes the message took (Complete)
  std::string why;  // what broke the protocol (Invalid)
};

// Decode one message from the front of `bytes` (which may hold more, or less, than one).
ParseResult parse_hello(std::string_view bytes, Hello& out);
ParseResult parse_request(std::string_view bytes, Request& out);

void put_u8(std::string& out, uint8_t v);
void put_u32(std::string& out, uint32_t v);
void put_i32(std::string& out, int32_t v);
void put_i64(std::string& out, int64_t v);
void put_str(std::string& out, std::string_view s);

std::string encode_hello(const Hello& hello);
std::string encode_request(const Request& request);

}  // namespace dpt::dist::store_wire
