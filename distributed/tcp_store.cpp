#include <unistd.h>

#include "distributed/socket.h"
#include "distributed/store.h"
#include "distributed/tcp_store_server.h"

namespace dpt::dist {
namespace {

using Clock = std::chrono::steady_clock;

// The server answers a waiting request when its own timeout passes; the client allows this much more
// for the reply to travel before it declares the server unresponsive.
constexpr auto kReplySlack = std::chrono::seconds(10);

void put_u8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_i64(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_str(std::string& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

std::string join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + ("'" + k + "'");
  return out;
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, bool is_server, int rank, int world_size,
                   Milliseconds timeout)
    : Store(rank, world_size, timeout), host_(host), port_(port) {
  if (is_server) {
    server_ = std::make_unique<TcpStoreServer>(port);
    port_ = server_->port();
  }
  // Rank 0 reaches its own server over loopback: the master address may name an interface that
  // routes elsewhere (or not at all) from inside this host.
  std::string connect_host = is_server ? "127.0.0.1" : host_;
  fd_ = net::connect_tcp(connect_host, port_, Clock::now() + timeout);
}

TcpStore::~TcpStore() {
  net::close_fd(fd_);
  server_.reset();
}

std::string TcpStore::describe() const { return "TCP store at " + host_ + ":" + std::to_string(port_); }

void TcpStore::send_request(const std::string& request, const std::string& what) {
  net::send_all(fd_, request.data(), request.size(), describe() + ": " + what);
}

void TcpStore::recv_exact(void* data, size_t n, Clock::time_point deadline, const std::string& what) {
  std::string context = describe() + ": " + what;
  if (!net::recv_all(fd_, data, n, deadline, context)) {
    DPT_FAIL("{}: the store closed the connection (rank 0, which hosts it, has exited or failed)", context);
  }
}

uint8_t TcpStore::recv_u8(Clock::time_point deadline, const std::string& what) {
  uint8_t v = 0;
  recv_exact(&v, sizeof(v), deadline, what);
  return v;
}
uint32_t TcpStore::recv_u32(Clock::time_point deadline, const std::string& what) {
  uint32_t v = 0;
  recv_exact(&v, sizeof(v), deadline, what);
  return v;
}
int64_t TcpStore::recv_i64(Clock::time_point deadline, const std::string& what) {
  int64_t v = 0;
  recv_exact(&v, sizeof(v), deadline, what);
  return v;
}
std::string TcpStore::recv_str(Clock::time_point deadline, const std::string& what) {
  uint32_t n = recv_u32(deadline, what);
  std::string s(n, '\0');
  if (n > 0) recv_exact(s.data(), n, deadline, what);
  return s;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  std::string req;
  put_u8(req, static_cast<uint8_t>(StoreCommand::Set));
  put_str(req, key);
  put_str(req, value);
  std::string what = "set '" + key + "'";
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(req, what);
  recv_u8(Clock::now() + timeout_ + kReplySlack, what);
}

std::string TcpStore::get(const std::string& key) {
  std::string req;
  put_u8(req, static_cast<uint8_t>(StoreCommand::Get));
  put_str(req, key);
  put_i64(req, timeout_.count());
  std::string what = "get '" + key + "'";
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(req, what);
  auto deadline = Clock::now() + timeout_ + kReplySlack;
  uint8_t status = recv_u8(deadline, what);
  std::string value = recv_str(deadline, what);
  if (status == kStoreShuttingDown) {
    throw StoreShutdownError(fmt::format("{}: rank 0, which hosts the store, shut down while this rank waited "
                                         "for key '{}'",
                                         describe(), key),
                             {key});
  }
  if (status != kStoreOk) {
    throw StoreTimeoutError(fmt::format("{}: timed out after {} ms waiting for key '{}' (the rank that sets it "
                                        "has not arrived)",
                                        describe(), timeout_.count(), key),
                            {key});
  }
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string req;
  put_u8(req, static_cast<uint8_t>(StoreCommand::Add));
  put_str(req, key);
  put_i64(req, delta);
  std::string what = "add '" + key + "'";
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(req, what);
  return recv_i64(Clock::now() + timeout_ + kReplySlack, what);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::string req;
  put_u8(req, static_cast<uint8_t>(StoreCommand::Check));
  put_u32(req, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) put_str(req, k);
  std::string what = "check " + join(keys);
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(req, what);
  auto deadline = Clock::now() + timeout_ + kReplySlack;
  recv_u8(deadline, what);
  uint32_t n = recv_u32(deadline, what);
  for (uint32_t i = 0; i < n; ++i) recv_str(deadline, what);
  return n == 0;
}

std::vector<std::string> TcpStore::wait_for(const std::vector<std::string>& keys, Milliseconds timeout) {
  std::string req;
  put_u8(req, static_cast<uint8_t>(StoreCommand::Wait));
  put_u32(req, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) put_str(req, k);
  put_i64(req, timeout.count());
  std::string what = "wait for " + join(keys);
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(req, what);
  auto deadline = Clock::now() + timeout + kReplySlack;
  uint8_t status = recv_u8(deadline, what);
  uint32_t n = recv_u32(deadline, what);
  std::vector<std::string> missing(n);
  for (auto& k : missing) k = recv_str(deadline, what);
  if (status == kStoreShuttingDown) {
    std::string names;
    for (const auto& k : missing) names += (names.empty() ? "'" : ", '") + k + "'";
    throw StoreShutdownError(fmt::format("{}: rank 0, which hosts the store, shut down during a {}; still missing: {}",
                                         describe(), what, names),
                             std::move(missing));
  }
  return missing;
}

bool TcpStore::remove(const std::string& key) {
  std::string req;
  put_u8(req, static_cast<uint8_t>(StoreCommand::Remove));
  put_str(req, key);
  std::string what = "remove '" + key + "'";
  std::lock_guard<std::mutex> lock(mutex_);
  send_request(req, what);
  return recv_u8(Clock::now() + timeout_ + kReplySlack, what) != 0;
}

}  // namespace dpt::dist
