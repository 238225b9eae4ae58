#pragma once
// Rendezvous key-value store. Rank 0 hosts it (a server thread inside that process); every rank,
// rank 0 included, talks to it over TCP. It carries the NCCL unique id, Gloo's connection addresses,
// barriers and the debug-mode collective fingerprints.
//
// Every call is bounded by a timeout. Errors name the store's address, the key, and for wait/barrier
// the keys (ranks) still missing, so a rank that never arrived is named instead of hanging the job.
// Values are byte strings (std::string is used as a binary-safe buffer).
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "rendezvous/env.h"

namespace dpt::dist {

using Milliseconds = std::chrono::milliseconds;
inline constexpr Milliseconds kDefaultStoreTimeout{std::chrono::minutes(5)};

// Thrown when a wait/get/barrier runs past its timeout; `missing` holds the keys that never appeared.
class StoreTimeoutError : public dpt::Error {
 public:
  StoreTimeoutError(const std::string& message, std::vector<std::string> missing)
      : dpt::Error(message), missing(std::move(missing)) {}
  std::vector<std::string> missing;
};

// Thrown when the store's host (rank 0) shuts down while this rank waits; `missing` as above.
class StoreShutdownError : public StoreTimeoutError {
 public:
  using StoreTimeoutError::StoreTimeoutError;
};

class Store {
 public:
  // rank/world_size: this process's place in the group that uses the store (for barrier).
  Store(int rank, int world_size, Milliseconds timeout) : rank_(rank), world_size_(world_size), timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists (up to timeout()), then returns its value.
  virtual std::string get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (missing counts as 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists now; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists or `timeout` passes; returns the keys still missing (empty: success).
  // Throws StoreShutdownError if the store's host exits meanwhile.
  virtual std::vector<std::string> wait_for(const std::vector<std::string>& keys, Milliseconds timeout) = 0;
  virtual bool remove(const std::string& key) = 0;  // true when the key existed
  // "TCP store at 10.0.0.1:29500" (plus a prefix for PrefixStore): goes into every error message.
  virtual std::string describe() const = 0;

  // wait_for that throws StoreTimeoutError naming the store, the timeout and the missing keys.
  void wait(const std::vector<std::string>& keys, Milliseconds timeout);
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  // All world_size() ranks meet; on timeout throws naming the ranks that never arrived. Barriers with
  // the same name may be repeated: each call on a rank uses the next generation of keys.
  void barrier(const std::string& name, Milliseconds timeout);
  void barrier(const std::string& name) { barrier(name, timeout_); }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  Milliseconds timeout() const { return timeout_; }
  void set_timeout(Milliseconds timeout) { timeout_ = timeout; }

 protected:
  int rank_;
  int world_size_;
  Milliseconds timeout_;

 private:
  void leave_barrier(const std::string& base, Milliseconds timeout);

  std::mutex barrier_mutex_;
  std::map<std::string, int64_t> barrier_generation_;
};

class TcpStoreServer;
class Heartbeat;

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // the store's address (clients)
  int port = 0;                    // its port; for the server 0 picks a free one (see TcpStore::port)
  bool is_server = false;          // rank 0: host the store in this process
  int rank = 0;
  int world_size = 1;
  Milliseconds timeout = kDefaultStoreTimeout;
  // Every rank of a job presents the same job id (and world size) when it connects, and the store
  // refuses any other: two jobs given one port never mix their ranks.
  std::string job_id;
  int listen_fd = -1;          // server: the socket the launcher bound for it, used instead of binding `port`
  std::string heartbeat_file;  // touched every second while the store lives (dpt-run watches it)
};

// The options for the world's store of a process launched as `env` describes.
TcpStoreOptions tcp_store_options(const DistEnv& env, Milliseconds timeout);

// The TCP store. The server (rank 0) runs TcpStoreServer on `port` and connects to it like every other
// rank. A client retries connecting until `timeout`, then fails naming host:port; it fails at once when
// the store there belongs to another job. Calls from several threads are serialised on the one
// connection; every call is bounded by the timeout and gives way to a stop request (socket.h). After a
// call fails mid-exchange the connection is out of step, and later calls fail naming that first error.
class TcpStore : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options);
  // A store of tests and tools that need no job id.
  TcpStore(const std::string& host, int port, bool is_server, int rank, int world_size,
           Milliseconds timeout = kDefaultStoreTimeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  std::vector<std::string> wait_for(const std::vector<std::string>& keys, Milliseconds timeout) override;
  bool remove(const std::string& key) override;
  std::string describe() const override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  void introduce(TimePoint deadline);
  // Sends a request and reads its status byte; an error reply is thrown naming `what`.
  uint8_t exchange(const std::string& request, const std::string& what, TimePoint deadline);
  void recv_exact(void* data, size_t n, TimePoint deadline, const std::string& what);
  uint8_t recv_u8(TimePoint deadline, const std::string& what);
  uint32_t recv_u32(TimePoint deadline, const std::string& what);
  int64_t recv_i64(TimePoint deadline, const std::string& what);
  std::string recv_str(TimePoint deadline, const std::string& what, size_t max);
  [[noreturn]] void fail(const std::string& what, const std::string& why);

  std::string host_;
  int port_;
  std::string job_id_;
  int fd_ = -1;
  std::mutex mutex_;    // one request/reply in flight on the connection
  std::string broken_;  // the error that left the connection out of step, if any
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Heartbeat> heartbeat_;
};

// Every key gets `prefix` + "/" in front: one namespace per process group, per restart attempt.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  // For a sub-group: the rank and size within that group (for barrier).
  PrefixStore(std::string prefix, std::shared_ptr<Store> base, int rank, int world_size);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  std::vector<std::string> wait_for(const std::vector<std::string>& keys, Milliseconds timeout) override;
  bool remove(const std::string& key) override;
  std::string describe() const override;

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace dpt::dist
