#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "rendezvous/socket.h"
#include "rendezvous/store.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/tcp_store_server.h"

namespace dpt::dist {
namespace {

using namespace store_wire;
using Clock = std::chrono::steady_clock;

// The server answers a waiting request when its own timeout passes; the client allows this much more
// for the reply to travel before it declares the server unresponsive.
constexpr auto kReplySlack = std::chrono::seconds(10);

std::string join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + ("'" + k + "'");
  return out;
}

// A wait's timeout as sent to the server (which refuses anything longer than kMaxWaitMs), and the
// deadline for its reply: neither may overflow, whatever timeout a user configured.
int64_t wire_timeout(Milliseconds timeout) { return std::clamp<int64_t>(timeout.count(), 0, kMaxWaitMs); }
Clock::time_point reply_deadline(Milliseconds timeout) {
  return net::deadline_after(Milliseconds(wire_timeout(timeout)) + kReplySlack);
}

// The server drops a connection whose request breaks a bound: say so here instead, naming the call.
void check_bounds(const std::string& where, const std::vector<std::string>& keys, size_t value_bytes = 0) {
  DPT_CHECK(keys.size() <= kMaxKeysPerRequest, "{}: {} keys in one call (the store takes at most {})", where,
            keys.size(), kMaxKeysPerRequest);
  for (const auto& k : keys)
    DPT_CHECK(k.size() <= kMaxKeyBytes, "{}: a key of {} bytes (the store takes at most {})", where, k.size(),
              kMaxKeyBytes);
  DPT_CHECK(value_bytes <= kMaxValueBytes, "{}: a value of {} bytes (the store takes at most {})", where, value_bytes,
            kMaxValueBytes);
}

}  // namespace

TcpStoreOptions tcp_store_options(const DistEnv& env, Milliseconds timeout) {
  TcpStoreOptions o;
  o.host = env.master_addr;
  o.port = env.master_port;
  o.is_server = env.rank == 0;
  o.rank = env.rank;
  o.world_size = env.world_size;
  o.timeout = timeout;
  o.job_id = env.job_id;
  o.listen_fd = env.rank == 0 ? env.store_fd : -1;
  o.heartbeat_file = env.heartbeat_file;
  return o;
}

TcpStore::TcpStore(const std::string& host, int port, bool is_server, int rank, int world_size, Milliseconds timeout)
    : TcpStore([&] {
        TcpStoreOptions o;
        o.host = host;
        o.port = port;
        o.is_server = is_server;
        o.rank = rank;
        o.world_size = world_size;
        o.timeout = timeout;
        return o;
      }()) {}

TcpStore::TcpStore(const TcpStoreOptions& o)
    : Store(o.rank, o.world_size, o.timeout), host_(o.host), port_(o.port), job_id_(o.job_id) {
  if (o.is_server) {
    TcpStoreServerOptions so;
    so.port = o.port;
    so.listen_fd = o.listen_fd;
    so.job_id = o.job_id;
    so.world_size = o.world_size;
    server_ = std::make_unique<TcpStoreServer>(so);
    port_ = server_->port();
  }
  // Rank 0 reaches its own server over loopback: the master address may name an interface that
  // routes elsewhere (or not at all) from inside this host.
  std::string connect_host = o.is_server ? "127.0.0.1" : host_;
  auto deadline = net::deadline_after(o.timeout);
  fd_ = net::connect_tcp(connect_host, port_, deadline);
  try {
    introduce(deadline);
  } catch (...) {
    net::close_fd(fd_);
    throw;
  }
  // The store lives as long as this process takes part in the job: the right span for its heartbeat.
  if (!o.heartbeat_file.empty()) {
    try {
      heartbeat_ = std::make_unique<Heartbeat>(o.heartbeat_file);
    } catch (const std::exception& e) {
      spdlog::warn("{} (dpt-run cannot tell whether this rank stops making progress)", e.what());
    }
  }
}

TcpStore::~TcpStore() {
  heartbeat_.reset();
  net::close_fd(fd_);
  server_.reset();
}

std::string TcpStore::describe() const { return "TCP store at " + host_ + ":" + std::to_string(port_); }

void TcpStore::fail(const std::string& what, const std::string& why) {
  std::string message = fmt::format("{}: {}: {}", describe(), what, why);
  broken_ = message;
  DPT_FAIL("{}", message);
}

void TcpStore::introduce(TimePoint deadline) {
  std::string what = "joining";
  std::string hello = encode_hello({job_id_, rank_, world_size_});
  net::send_all(fd_, hello.data(), hello.size(), deadline, describe() + ": " + what);
  uint32_t magic = 0;
  recv_exact(&magic, sizeof(magic), deadline, what);
  if (magic != kMagic) {
    fail(what, fmt::format("the service on port {} is not a dptrain store (it answered with something else); are "
                           "MASTER_ADDR and MASTER_PORT right?",
                           port_));
  }
  auto status = static_cast<HelloStatus>(recv_u8(deadline, what));
  std::string message = recv_str(deadline, what, kMaxMessageBytes);
  if (status == HelloStatus::OtherJob) {
    DPT_FAIL(
        "the store at {}:{} belongs to another job ({}), so rank {} (job id '{}') cannot join it. Each job "
        "needs its own MASTER_PORT, and the ranks of one job must share their job id (dpt-run sets "
        "DPT_JOB_ID for its workers; with several dpt-runs give each the same --rdzv-id)",
        host_, port_, message, rank_, job_id_);
  }
  if (status != HelloStatus::Welcome) fail(what, "the store refused this rank: " + message);
}

void TcpStore::recv_exact(void* data, size_t n, TimePoint deadline, const std::string& what) {
  if (!broken_.empty())
    DPT_FAIL("{}: {}: the connection is unusable since an earlier error: {}", describe(), what, broken_);
  std::string context = describe() + ": " + what;
  bool got = false;
  try {
    got = net::recv_all(fd_, data, n, deadline, context);
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw;
  }
  if (!got) fail(what, "the store closed the connection (rank 0, which hosts it, has exited or failed)");
}

uint8_t TcpStore::recv_u8(TimePoint deadline, const std::string& what) {
  uint8_t v = 0;
  recv_exact(&v, sizeof(v), deadline, what);
  return v;
}
uint32_t TcpStore::recv_u32(TimePoint deadline, const std::string& what) {
  uint32_t v = 0;
  recv_exact(&v, sizeof(v), deadline, what);
  return v;
}
int64_t TcpStore::recv_i64(TimePoint deadline, const std::string& what) {
  int64_t v = 0;
  recv_exact(&v, sizeof(v), deadline, what);
  return v;
}
std::string TcpStore::recv_str(TimePoint deadline, const std::string& what, size_t max) {
  uint32_t n = recv_u32(deadline, what);
  if (n > max) fail(what, fmt::format("the store sent a string of {} bytes (at most {} are valid)", n, max));
  std::string s(n, '\0');
  if (n > 0) recv_exact(s.data(), n, deadline, what);
  return s;
}

uint8_t TcpStore::exchange(const std::string& request, const std::string& what, TimePoint deadline) {
  if (!broken_.empty())
    DPT_FAIL("{}: {}: the connection is unusable since an earlier error: {}", describe(), what, broken_);
  try {
    net::send_all(fd_, request.data(), request.size(), deadline, describe() + ": " + what);
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw;
  }
  uint8_t status = recv_u8(deadline, what);
  if (status == static_cast<uint8_t>(Status::Error)) {
    DPT_FAIL("{}: {}: refused by the store: {}", describe(), what, recv_str(deadline, what, kMaxMessageBytes));
  }
  if (status > static_cast<uint8_t>(Status::Error)) fail(what, fmt::format("unknown reply status {}", status));
  return status;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  std::string what = "set '" + key + "'";
  check_bounds(describe() + ": " + what, {key}, value.size());
  std::string req = encode_request({Command::Set, {key}, value, 0});
  std::lock_guard<std::mutex> lock(mutex_);
  exchange(req, what, reply_deadline(timeout_));
}

std::string TcpStore::get(const std::string& key) {
  std::string what = "get '" + key + "'";
  check_bounds(describe() + ": " + what, {key});
  std::string req = encode_request({Command::Get, {key}, {}, wire_timeout(timeout_)});
  std::lock_guard<std::mutex> lock(mutex_);
  auto deadline = reply_deadline(timeout_);
  auto status = static_cast<Status>(exchange(req, what, deadline));
  std::string value = recv_str(deadline, what, kMaxValueBytes);
  if (status == Status::ShuttingDown) {
    throw StoreShutdownError(fmt::format("{}: rank 0, which hosts the store, shut down while this rank waited "
                                         "for key '{}'",
                                         describe(), key),
                             {key});
  }
  if (status != Status::Ok) {
    throw StoreTimeoutError(fmt::format("{}: timed out after {} ms waiting for key '{}' (the rank that sets it "
                                        "has not arrived)",
                                        describe(), timeout_.count(), key),
                            {key});
  }
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string what = "add '" + key + "'";
  check_bounds(describe() + ": " + what, {key});
  std::string req = encode_request({Command::Add, {key}, {}, delta});
  std::lock_guard<std::mutex> lock(mutex_);
  auto deadline = reply_deadline(timeout_);
  exchange(req, what, deadline);
  return recv_i64(deadline, what);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::string what = "check " + join(keys);
  check_bounds(describe() + ": check", keys);
  std::string req = encode_request({Command::Check, keys, {}, 0});
  std::lock_guard<std::mutex> lock(mutex_);
  auto deadline = reply_deadline(timeout_);
  exchange(req, what, deadline);
  uint32_t n = recv_u32(deadline, what);
  if (n > keys.size()) fail(what, fmt::format("the store named {} missing keys of {}", n, keys.size()));
  for (uint32_t i = 0; i < n; ++i) recv_str(deadline, what, kMaxKeyBytes);
  return n == 0;
}

std::vector<std::string> TcpStore::wait_for(const std::vector<std::string>& keys, Milliseconds timeout) {
  std::string what = "wait for " + join(keys);
  check_bounds(describe() + ": wait", keys);
  std::string req = encode_request({Command::Wait, keys, {}, wire_timeout(timeout)});
  std::lock_guard<std::mutex> lock(mutex_);
  auto deadline = reply_deadline(timeout);
  auto status = static_cast<Status>(exchange(req, what, deadline));
  uint32_t n = recv_u32(deadline, what);
  if (n > keys.size()) fail(what, fmt::format("the store named {} missing keys of {}", n, keys.size()));
  std::vector<std::string> missing(n);
  for (auto& k : missing) k = recv_str(deadline, what, kMaxKeyBytes);
  if (status == Status::ShuttingDown) {
    std::string names;
    for (const auto& k : missing) names += (names.empty() ? "'" : ", '") + k + "'";
    throw StoreShutdownError(fmt::format("{}: rank 0, which hosts the store, shut down during a {}; still missing: {}",
                                         describe(), what, names),
                             std::move(missing));
  }
  return missing;
}

bool TcpStore::remove(const std::string& key) {
  std::string what = "remove '" + key + "'";
  check_bounds(describe() + ": " + what, {key});
  std::string req = encode_request({Command::Remove, {key}, {}, 0});
  std::lock_guard<std::mutex> lock(mutex_);
  auto deadline = reply_deadline(timeout_);
  exchange(req, what, deadline);
  return recv_u8(deadline, what) != 0;
}

}  // namespace dpt::dist
