#pragma once
// The server half of TcpStore, run by rank 0: a listening socket, one thread per connected rank, and
// the key-value map. Requests that wait (get, wait) park on a condition variable until their keys
// appear or their deadline passes; the reply then lists the keys still missing.
//
// Wire format (native byte order; all ranks of a job share an architecture): a request is a one-byte
// command followed by its fields; strings are a uint32 length and the bytes.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dpt::dist {

enum class StoreCommand : uint8_t { Set = 1, Get = 2, Add = 3, Check = 4, Wait = 5, Remove = 6 };
// First byte of a get/check/wait reply.
inline constexpr uint8_t kStoreOk = 0;
inline constexpr uint8_t kStoreTimedOut = 1;
inline constexpr uint8_t kStoreShuttingDown = 2;  // the hosting rank is exiting; keys listed are missing

class TcpStoreServer {
 public:
  explicit TcpStoreServer(int port);  // 0: any free port
  ~TcpStoreServer();                  // closes every connection and joins the threads
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  void accept_loop();
  void serve(int fd);
  // Waits until all keys exist or the deadline passes; returns the missing keys. Caller holds `lock`.
  std::vector<std::string> wait_keys(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                                     int64_t timeout_ms);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;

  std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
  std::vector<int> client_fds_;
  std::vector<std::thread> client_threads_;
};

}  // namespace dpt::dist
