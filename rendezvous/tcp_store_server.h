#pragma once
// The server half of TcpStore, run by rank 0: one thread polls the listening socket and every
// connection, and owns the key-value map. No client, however it behaves, can stop it serving the
// others, hold its descriptors, grow its memory past the wire format's bounds (store_protocol.h), or
// keep rank 0 from exiting:
//   - a connection must introduce itself (store_wire::Hello) within hello_timeout, and at most
//     kMaxStrangers connections may be unintroduced at once (the oldest is dropped for a newcomer):
//     a port scan or health check uses a bounded number of descriptors, each closed when it goes away;
//   - a hello with another job's id or world size is refused; the client reports it;
//   - a message that breaks a bound or the protocol drops the connection, with a warning naming the
//     peer's address;
//   - replies are written without blocking; a client that stops reading them, or stalls halfway
//     through a request, is dropped after stall_timeout;
//   - introduced connections are capped at twice the world size plus a margin.
// Requests that wait (get, wait) park until their keys appear or their deadline passes; the reply then
// lists the keys still missing. Destroying the server answers parked waits "shutting down" and closes
// every connection at once.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace dpt::dist {

struct TcpStoreServerOptions {
  int port = 0;        // 0: any free port (see TcpStoreServer::port)
  int listen_fd = -1;  // a socket already bound by the launcher: used (through a duplicate) instead of `port`
  std::string job_id;  // a client must present the same id ...
  int world_size = 1;  // ... and world size
  std::chrono::milliseconds hello_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds stall_timeout{std::chrono::seconds(60)};
};

class TcpStoreServer {
 public:
  static constexpr int kMaxStrangers = 64;

  explicit TcpStoreServer(const TcpStoreServerOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  class Loop;

  int port_ = 0;
  int wake_fd_ = -1;  // an eventfd that ends the loop's poll() when the server is destroyed
  std::atomic<bool> stopping_{false};
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace dpt::dist
