// The rendezvous store against peers that do not play by its rules: port scanners and health checks
// that connect and say nothing (or close at once), garbage, lengths, counts and timeouts far past any
// bound, another job's ranks, a client that stops reading its replies, and a stop request while a
// rank waits. The server must keep serving its own job through all of it, hold a bounded number of
// descriptors and bytes, and never make rank 0 wait on anyone when it exits.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "processes.h"
#include "rendezvous/socket.h"
#include "rendezvous/store.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/tcp_store_server.h"

namespace dpt::dist {
namespace {

using namespace std::chrono_literals;
namespace wire = store_wire;


// Failure bounds only: every wait below ends as soon as its condition holds.
constexpr auto kLimit = 30s;

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = kLimit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return condition();
}

size_t open_descriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

int64_t resident_kb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// Warnings the server logs, kept for the test to read.
class CapturedLog {
 public:
  CapturedLog() { spdlog::default_logger()->sinks().push_back(sink_); }
  ~CapturedLog() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  bool wait_for(const std::string& text) {
    return eventually([&] {
      for (const auto& line : sink_->last_formatted())
        if (line.find(text) != std::string::npos) return true;
      return false;
    });
  }
  std::string all() const {
    std::string out;
    for (const auto& line : sink_->last_formatted()) out += line;
    return out;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096);
};

// A TCP connection to the store spoken by hand.
class Raw {
 public:
  explicit Raw(int port) : fd_(net::connect_tcp("127.0.0.1", port, net::deadline_after(kLimit))) {}
  ~Raw() { net::close_fd(fd_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  // Best effort: the server may already have dropped us.
  void send(const std::string& bytes) {
    [[maybe_unused]] auto k = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // "127.0.0.1:PORT" of our end, as the server names us.
  std::string address() const {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  // True once the server has closed the connection (end of stream or reset), reading whatever comes first.
  bool closed_by_server(std::chrono::milliseconds limit = kLimit) {
    auto end = std::chrono::steady_clock::now() + limit;
    char buf[65536];
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t k = ::recv(fd_, buf, sizeof(buf), 0);
      if (k == 0 || (k < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }
  // Sends a valid hello and reads the answer: true when welcomed.
  bool join(const std::string& job_id, int rank, int world) {
    send(wire::encode_hello({job_id, rank, world}));
    uint32_t magic = 0;
    uint8_t status = 9;
    uint32_t n = 0;
    auto deadline = net::deadline_after(kLimit);
    if (!net::recv_all(fd_, &magic, 4, deadline, "hello") || !net::recv_all(fd_, &status, 1, deadline, "hello") ||
        !net::recv_all(fd_, &n, 4, deadline, "hello"))
      return false;
    std::string message(n, '\0');
    if (n > 0) net::recv_all(fd_, message.data(), n, deadline, "hello");
    return magic == wire::kMagic && status == static_cast<uint8_t>(wire::HelloStatus::Welcome);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

TcpStoreServerOptions job(const std::string& id, int world) {
  TcpStoreServerOptions o;
  o.job_id = id;
  o.world_size = world;
  return o;
}

TcpStoreOptions member(int port, const std::string& id, int rank, int world) {
  TcpStoreOptions o;
  o.port = port;
  o.rank = rank;
  o.world_size = world;
  o.job_id = id;
  o.timeout = 10s;
  return o;
}

// The store still does its job for a rank of its own.
void expect_serves(int port, const std::string& id, int world) {
  TcpStore rank(member(port, id, world - 1, world));
  rank.set("alive", "yes");
  EXPECT_EQ(rank.get("alive"), "yes");
  const int64_t n = rank.add("n", 2);
  EXPECT_EQ(rank.add("n", 0), n);
}

TEST(StoreHostile, AConnectionFloodNeitherLeaksDescriptorsNorStopsTheStore) {
  CapturedLog log;
  TcpStoreServer server(job("job", 2));
  const size_t base = open_descriptors();
  // Health checks: connect and close at once, far more times than a process has descriptors by default.
  for (int i = 0; i < 1100; ++i) Raw probe(server.port());
  expect_serves(server.port(), "job", 2);
  EXPECT_TRUE(eventually([&] { return open_descriptors() <= base + 2; }))
      << open_descriptors() << " descriptors open, " << base << " before the flood";

  // Scanners that connect and stay silent: the server keeps at most kMaxStrangers of them, closing the
  // oldest first, and still serves its ranks.
  std::vector<std::unique_ptr<Raw>> silent;
  for (int i = 0; i < 300; ++i) silent.push_back(std::make_unique<Raw>(server.port()));
  expect_serves(server.port(), "job", 2);
  EXPECT_TRUE(silent.front()->closed_by_server()) << "the oldest silent connection is still open";
  EXPECT_LE(open_descriptors(), base + silent.size() + TcpStoreServer::kMaxStrangers + 2);
  EXPECT_TRUE(log.wait_for(": sent no hello while 64 newer connections waited")) << log.all();
  EXPECT_CONTAINS(log.all(), "dropped the connection from 127.0.0.1:");
  silent.clear();
  EXPECT_TRUE(eventually([&] { return open_descriptors() <= base + 2; }));
}

TEST(StoreHostile, AConnectionThatSaysNothingIsClosedAfterTheHelloTimeout) {
  CapturedLog log;
  auto options = job("job", 1);
  options.hello_timeout = 200ms;
  TcpStoreServer server(options);
  Raw silent(server.port());
  EXPECT_TRUE(silent.closed_by_server());
  EXPECT_TRUE(log.wait_for("dropped the connection from " + silent.address() + ": sent no hello within 200 ms"))
      << log.all();
}

// Each hostile message is answered by closing that connection, with a warning naming the peer, before
// anything of the size it claims is allocated; the store serves on.
TEST(StoreHostile, LengthsCountsAndTimeoutsBeyondTheBoundsDropThePeerBeforeAnyAllocation) {
  CapturedLog log;
  TcpStoreServer server(job("job", 2));
  const int64_t rss_before = resident_kb();
  struct Case {
    const char* name;
    bool join_first;
    std::string bytes;
    std::string warning;
  };
  auto str_header = [](uint32_t n) {
    std::string s;
    wire::put_u32(s, n);
    return s;
  };
  auto command = [](wire::Command c) {
    std::string s;
    wire::put_u8(s, static_cast<uint8_t>(c));
    return s;
  };
  std::vector<Case> cases;
  {
    std::string hello;
    wire::put_u32(hello, wire::kMagic);
    wire::put_u32(hello, wire::kVersion);
    hello += str_header(0xFFFFFFF0u);
    cases.push_back({"job id length 0xFFFFFFF0", false, hello, "a job id of 4294967280 bytes"});
  }
  cases.push_back({"not our protocol", false, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "wrong greeting"});
  cases.push_back({"set: key length 0xFFFFFFF0", true, command(wire::Command::Set) + str_header(0xFFFFFFF0u),
                   "a key of 4294967280 bytes"});
  {
    std::string set = command(wire::Command::Set);
    wire::put_str(set, "k");
    set += str_header(0xFFFFFFF0u);
    cases.push_back({"set: value length 0xFFFFFFF0", true, set, "a value of 4294967280 bytes"});
  }
  cases.push_back(
      {"wait: 2^27 keys", true, command(wire::Command::Wait) + str_header(1u << 27), "134217728 keys in one request"});
  {
    std::string get = command(wire::Command::Get);
    wire::put_str(get, "k");
    wire::put_i64(get, INT64_MAX);
    cases.push_back({"get: timeout INT64_MAX", true, get, "a timeout of 9223372036854775807 ms"});
  }
  {
    std::string get = command(wire::Command::Get);
    wire::put_str(get, "k");
    wire::put_i64(get, -1);
    cases.push_back({"get: timeout -1", true, get, "a timeout of -1 ms"});
  }
  cases.push_back({"unknown command", true, std::string(1, '\x7f'), "unknown command 127"});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Raw peer(server.port());
    if (c.join_first) {
      ASSERT_TRUE(peer.join("job", 1, 2));
    }
    peer.send(c.bytes);
    EXPECT_TRUE(peer.closed_by_server());
    EXPECT_TRUE(
        log.wait_for((c.join_first ? "dropped rank 1 at " : "dropped the connection from ") + peer.address() + ": "))
        << log.all();
    EXPECT_CONTAINS(log.all(), c.warning);
  }
  expect_serves(server.port(), "job", 2);
  // Nothing near the claimed sizes (gigabytes) was ever allocated.
  EXPECT_LT(resident_kb() - rss_before, 64 * 1024);
}

TEST(StoreHostile, AnotherJobsRankIsRefusedWithAClearErrorAndTheJobGoesOn) {
  CapturedLog log;
  TcpStoreServer server(job("ours", 2));
  std::string where = "127.0.0.1:" + std::to_string(server.port());
  std::string error;
  try {
    TcpStore stranger(member(server.port(), "theirs", 1, 2));
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_CONTAINS(error, "the store at " + where + " belongs to another job (its job id differs)");
  EXPECT_CONTAINS(error, "job id 'theirs'");
  try {
    TcpStore other_size(member(server.port(), "ours", 1, 4));
    error = "(joined)";
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_CONTAINS(error, "belongs to another job (it serves a job of 2 ranks, not 4)");
  EXPECT_TRUE(log.wait_for("refused rank 1 at 127.0.0.1:")) << log.all();
  expect_serves(server.port(), "ours", 2);
}

TEST(StoreHostile, AClientOfAServiceThatIsNoStoreFailsNamingIt) {
  // Something else on the port: it answers anything with text.
  int listener = net::bind_tcp(0, true);
  net::start_listening(listener, 8);
  int port = net::bound_port(listener);
  std::thread service([listener] {
    int fd = ::accept(listener, nullptr, nullptr);
    std::string reply = "HTTP/1.1 400 Bad Request\r\n\r\n";
    [[maybe_unused]] auto k = ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    char buf[256];
    [[maybe_unused]] auto r = ::recv(fd, buf, sizeof(buf), 0);
    ::close(fd);
  });
  std::string error;
  try {
    TcpStore client(member(port, "job", 1, 2));
  } catch (const std::exception& e) {
    error = e.what();
  }
  service.join();
  net::close_fd(listener);
  EXPECT_CONTAINS(error, "is not a dptrain store");
}

// A member that sends requests and never reads the replies: the server answers the first, stops
// reading from it (no queue of replies grows), serves everyone else, and exits at once when rank 0 does.
TEST(StoreHostile, AClientThatStopsReadingHoldsNeitherTheOtherRanksNorRank0sExit) {
  auto host = std::make_unique<TcpStore>([] {
    TcpStoreOptions o;
    o.is_server = true;
    o.world_size = 3;
    o.job_id = "job";
    o.timeout = 10s;
    return o;
  }());
  const std::string big(8 << 20, 'x');
  host->set("big", big);
  Raw reader(host->port());
  ASSERT_TRUE(reader.join("job", 2, 3));
  int small = 4096;
  ::setsockopt(reader.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  std::string get = std::string(1, static_cast<char>(wire::Command::Get));
  wire::put_str(get, "big");
  wire::put_i64(get, 0);
  for (int i = 0; i < 64; ++i) reader.send(get);
  expect_serves(host->port(), "job", 3);
  auto exited = std::async(std::launch::async, [&] { host.reset(); });
  ASSERT_EQ(exited.wait_for(kLimit), std::future_status::ready) << "rank 0 cannot exit: its store waits on a client";
  EXPECT_TRUE(reader.closed_by_server());
}

std::atomic<int> g_fake_signal{0};
int fake_stop_signal() { return g_fake_signal.load(); }

// A rank waiting for peers that never come leaves as soon as it is asked to stop, not at its timeout.
TEST(StoreHostile, AWaitForPeersGivesWayToAStopRequest) {
  TcpStore host([] {
    TcpStoreOptions o;
    o.is_server = true;
    o.world_size = 2;
    o.timeout = std::chrono::hours(1);
    return o;
  }());
  set_stop_check(&fake_stop_signal);
  auto waiting = std::async(std::launch::async, [&] {
    try {
      host.barrier("init");
    } catch (const InterruptedError& e) {
      return std::string(e.what()) + " / signal " + std::to_string(e.signal);
    } catch (const std::exception& e) {
      return std::string("other error: ") + e.what();
    }
    return std::string("no error");
  });
  EXPECT_EQ(waiting.wait_for(200ms), std::future_status::timeout);  // it is waiting
  g_fake_signal = SIGTERM;
  auto status = waiting.wait_for(kLimit);
  set_stop_check(nullptr);
  g_fake_signal = 0;
  ASSERT_EQ(status, std::future_status::ready);
  std::string what = waiting.get();
  EXPECT_CONTAINS(what, "interrupted by SIGTERM");
  EXPECT_CONTAINS(what, "signal 15");
}

TEST(StoreHostile, TimeoutsTooLongForTheClockAreClampedNotOverflowed) {
  TcpStore host([] {
    TcpStoreOptions o;
    o.is_server = true;
    o.timeout = Milliseconds::max();
    return o;
  }());
  auto value = std::async(std::launch::async, [&] { return host.get("later"); });
  EXPECT_EQ(value.wait_for(100ms), std::future_status::timeout);
  TcpStore other([&] {
    TcpStoreOptions o;
    o.port = host.port();
    o.timeout = 10s;
    return o;
  }());
  other.set("later", "here");
  EXPECT_EQ(value.get(), "here");
  EXPECT_TRUE(host.wait_for({"later"}, Milliseconds::max()).empty());
}

}  // namespace
}  // namespace dpt::dist
