// The TCP rendezvous store: values, blocking gets, counters, barriers, and the errors a user sees when
// a rank never arrives or the store cannot be reached.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "rendezvous/socket.h"
#include "rendezvous/store.h"

namespace dpt::dist {
namespace {

using namespace std::chrono_literals;

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << text

TEST(TcpStore, SetGetAddCheckRemove) {
  TcpStore server("127.0.0.1", 0, true, 0, 2, 5s);
  TcpStore client("127.0.0.1", server.port(), false, 1, 2, 5s);
  std::string binary("a\0b\xff", 4);
  server.set("k", binary);
  EXPECT_EQ(client.get("k"), binary);
  client.set("k", "overwritten");
  EXPECT_EQ(server.get("k"), "overwritten");
  EXPECT_EQ(server.add("counter", 5), 5);
  EXPECT_EQ(client.add("counter", -2), 3);
  EXPECT_EQ(client.get("counter"), "3");
  EXPECT_TRUE(client.check({"k", "counter"}));
  EXPECT_FALSE(client.check({"k", "absent"}));
  EXPECT_TRUE(client.remove("k"));
  EXPECT_FALSE(client.remove("k"));
  EXPECT_FALSE(server.check({"k"}));
}

TEST(TcpStore, GetBlocksUntilAnotherRankSets) {
  TcpStore server("127.0.0.1", 0, true, 0, 2, 5s);
  auto port = server.port();
  auto value = std::async(std::launch::async, [port] {
    TcpStore client("127.0.0.1", port, false, 1, 2, 5s);
    return client.get("late");
  });
  std::this_thread::sleep_for(50ms);
  server.set("late", "here");
  EXPECT_EQ(value.get(), "here");
}

TEST(TcpStore, GetAndWaitTimeoutsNameTheStoreAndKeys) {
  TcpStore server("127.0.0.1", 0, true, 0, 1, 200ms);
  std::string where = "127.0.0.1:" + std::to_string(server.port());
  auto get_error = message_of([&] { server.get("never"); });
  EXPECT_CONTAINS(get_error, where);
  EXPECT_CONTAINS(get_error, "'never'");
  EXPECT_CONTAINS(get_error, "200 ms");
  server.set("present", "1");
  auto wait_error = message_of([&] { server.wait({"present", "a", "b"}, 100ms); });
  EXPECT_CONTAINS(wait_error, where);
  EXPECT_CONTAINS(wait_error, "2 of 3 keys");
  EXPECT_CONTAINS(wait_error, "'a', 'b'");
  EXPECT_THROW(server.wait({"a"}, 50ms), StoreTimeoutError);
  server.wait({"present"}, 50ms);  // no throw
}

TEST(TcpStore, BarrierReleasesAllRanksAndCanRepeat) {
  constexpr int kWorld = 3;
  TcpStore server("127.0.0.1", 0, true, 0, kWorld, 5s);
  auto port = server.port();
  std::vector<std::future<void>> ranks;
  for (int r = 1; r < kWorld; ++r) {
    ranks.push_back(std::async(std::launch::async, [port, r] {
      TcpStore client("127.0.0.1", port, false, r, kWorld, 5s);
      client.barrier("step");
      client.barrier("step");
    }));
  }
  server.barrier("step");
  server.barrier("step");
  for (auto& f : ranks) f.get();
}

TEST(TcpStore, BarrierTimeoutNamesTheMissingRanks) {
  TcpStore server("127.0.0.1", 0, true, 0, 4, 5s);
  TcpStore rank2("127.0.0.1", server.port(), false, 2, 4, 5s);
  auto other = std::async(std::launch::async, [&] { return message_of([&] { rank2.barrier("init", 300ms); }); });
  auto error = message_of([&] { server.barrier("init", 300ms); });
  EXPECT_CONTAINS(error, "barrier 'init' timed out after 300 ms on rank 0");
  EXPECT_CONTAINS(error, "2 of 4 ranks never arrived: 1, 3");
  std::string other_error = other.get();
  EXPECT_CONTAINS(other_error, "never arrived: 1, 3");
}

// A port of our own that refuses connections: bound (so that nobody else can take it) but not listening.
struct ReservedPort {
  int fd = net::bind_tcp(0, true);
  int port = net::bound_port(fd);
  ~ReservedPort() { net::close_fd(fd); }
};

TEST(TcpStore, ConnectFailureNamesHostAndPortWithinTheTimeout) {
  ReservedPort reserved;
  auto start = std::chrono::steady_clock::now();
  auto error = message_of([&] { TcpStore client("127.0.0.1", reserved.port, false, 1, 2, 300ms); });
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_CONTAINS(error, "cannot connect to the store at 127.0.0.1:" + std::to_string(reserved.port));
  EXPECT_LT(elapsed, 5s);
}

TEST(TcpStore, ClientConnectsToAServerThatStartsLater) {
  ReservedPort reserved;
  int port = reserved.port;
  auto client = std::async(std::launch::async, [port] {
    TcpStore c("127.0.0.1", port, false, 1, 2, 10s);
    return c.get("hello");
  });
  std::this_thread::sleep_for(200ms);
  // The server starts on the socket bound before the client tried (as rank 0 does on dpt-run's).
  TcpStoreOptions o;
  o.port = port;
  o.is_server = true;
  o.world_size = 2;
  o.timeout = 10s;
  o.listen_fd = reserved.fd;
  TcpStore server(o);
  server.set("hello", "world");
  EXPECT_EQ(client.get(), "world");
}

TEST(TcpStore, ServerExitIsAClearErrorForClients) {
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, true, 0, 2, 5s);
  TcpStore client("127.0.0.1", server->port(), false, 1, 2, 5s);
  client.set("x", "1");
  auto pending = std::async(std::launch::async, [&] { return message_of([&] { client.get("never-set"); }); });
  std::this_thread::sleep_for(100ms);
  server.reset();  // rank 0 went away
  std::string error = pending.get();
  EXPECT_CONTAINS(error, "rank 0, which hosts the store, shut down while this rank waited for key 'never-set'");
  // Any later call finds the connection closed.
  auto later = message_of([&] { client.set("y", "1"); client.get("y"); });
  EXPECT_CONTAINS(later, "127.0.0.1:");
}

TEST(TcpStore, HostingOnABusyPortFailsNamingThePort) {
  TcpStore first("127.0.0.1", 0, true, 0, 1, 1s);
  auto error = message_of([&] { TcpStore second("127.0.0.1", first.port(), true, 0, 1, 1s); });
  EXPECT_CONTAINS(error, "port " + std::to_string(first.port()));
}

TEST(PrefixStore, SeparatesNamespacesAndReportsUnprefixedKeys) {
  auto base = std::make_shared<TcpStore>("127.0.0.1", 0, true, 0, 1, 5s);
  PrefixStore a("attempt0", base);
  PrefixStore b("attempt1", base);
  a.set("id", "A");
  b.set("id", "B");
  EXPECT_EQ(a.get("id"), "A");
  EXPECT_EQ(b.get("id"), "B");
  EXPECT_EQ(base->get("attempt0/id"), "A");
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 7), 7);
  EXPECT_EQ(a.wait_for({"id", "zz"}, 50ms), std::vector<std::string>{"zz"});
  EXPECT_CONTAINS(message_of([&] { a.wait({"zz"}, 50ms); }), "prefix 'attempt0/'");
  a.barrier("solo");  // world of one: passes at once
}

}  // namespace
}  // namespace dpt::dist

namespace dpt::dist {
namespace {

TEST(TcpStore, ABarrierInterruptedByTheHostExitingStillNamesTheMissingRanks) {
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, true, 0, 3, std::chrono::seconds(5));
  auto client = std::make_shared<TcpStore>("127.0.0.1", server->port(), false, 1, 3, std::chrono::seconds(5));
  PrefixStore prefixed("attempt0", client);
  std::string error;
  std::thread waiter([&] {
    try {
      prefixed.barrier("init");
    } catch (const StoreShutdownError& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server.reset();  // rank 0 exits before ranks 0 and 2 arrived
  waiter.join();
  EXPECT_NE(error.find("rank 0, which hosts the store, shut down"), std::string::npos) << error;
  EXPECT_NE(error.find("2 of 3 ranks never arrived: 0, 2"), std::string::npos) << error;
}

}  // namespace
}  // namespace dpt::dist
