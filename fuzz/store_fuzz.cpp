// libFuzzer target: the TCP store's wire decoder on arbitrary bytes, as the server meets them from a
// peer: a hello, then requests, each decoded from the front of what has arrived. Every length, count
// and timeout must be refused (Invalid) before anything of the size it claims is allocated: scripts/
// fuzz.sh runs with -rss_limit_mb, so an allocation trusting the peer is a finding. Whatever decodes
// must respect the bounds and re-encode to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rendezvous/store_protocol.h"

namespace wire = dpt::dist::store_wire;

namespace {

void check_request(const wire::Request& r, std::string_view bytes) {
  if (r.keys.size() > wire::kMaxKeysPerRequest || r.value.size() > wire::kMaxValueBytes) __builtin_trap();
  for (const auto& k : r.keys)
    if (k.size() > wire::kMaxKeyBytes) __builtin_trap();
  if ((r.command == wire::Command::Get || r.command == wire::Command::Wait) &&
      (r.number < 0 || r.number > wire::kMaxWaitMs))
    __builtin_trap();
  if (wire::encode_request(r) != bytes) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  wire::Hello hello;
  auto h = wire::parse_hello(bytes, hello);
  if (h.state != wire::Parsed::Complete) return 0;
  if (h.used > wire::kHelloBytesMax || hello.job_id.size() > wire::kMaxJobIdBytes) __builtin_trap();
  if (wire::encode_hello(hello) != bytes.substr(0, h.used)) __builtin_trap();
  bytes.remove_prefix(h.used);
  while (!bytes.empty()) {
    wire::Request request;
    auto r = wire::parse_request(bytes, request);
    if (r.state != wire::Parsed::Complete) break;
    if (r.used == 0 || r.used > wire::kMaxRequestBytes) __builtin_trap();
    check_request(request, bytes.substr(0, r.used));
    bytes.remove_prefix(r.used);
  }
  return 0;
}
