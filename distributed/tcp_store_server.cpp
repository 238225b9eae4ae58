#include "distributed/tcp_store_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "distributed/socket.h"

namespace dpt::dist {
namespace {

using Clock = std::chrono::steady_clock;
const auto kNoDeadline = Clock::time_point::max();

// Reading side of one request: any failure means the client went away, which ends its thread.
struct Reader {
  int fd;
  bool read(void* p, size_t n) { return net::recv_all(fd, p, n, kNoDeadline, "store server"); }
  template <class T>
  T pod() {
    T v{};
    if (!read(&v, sizeof(v))) throw Error("client closed");
    return v;
  }
  std::string str() {
    auto n = pod<uint32_t>();
    std::string s(n, '\0');
    if (n > 0 && !read(s.data(), n)) throw Error("client closed");
    return s;
  }
};

void put_u8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_i64(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_str(std::string& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

}  // namespace

TcpStoreServer::TcpStoreServer(int port) {
  listen_fd_ = net::listen_tcp(port);
  port_ = net::bound_port(listen_fd_);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Parked waits wake and answer "shutting down" with the keys still missing (so a client can say
    // which ranks never arrived); blocked reads wake on the read-side shutdown, which still lets
    // those last replies out.
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RD);
    threads.swap(client_threads_);
  }
  changed_.notify_all();
  for (auto& t : threads) t.join();
  std::lock_guard<std::mutex> lock(mutex_);
  for (int fd : client_fds_) ::close(fd);
  ::close(listen_fd_);
}

void TcpStoreServer::accept_loop() {
  while (!stopping_) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down (or the listening socket broke: clients will see connection refused)
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    client_fds_.push_back(fd);
    client_threads_.emplace_back([this, fd] { serve(fd); });
  }
}

std::vector<std::string> TcpStoreServer::wait_keys(std::unique_lock<std::mutex>& lock,
                                                   const std::vector<std::string>& keys, int64_t timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto missing = [&] {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!data_.count(k)) out.push_back(k);
    return out;
  };
  changed_.wait_until(lock, deadline, [&] { return stopping_ || missing().empty(); });
  return missing();
}

void TcpStoreServer::serve(int fd) {
  Reader in{fd};
  try {
    while (!stopping_) {
      uint8_t cmd = 0;
      if (!in.read(&cmd, 1)) return;
      std::string reply;
      switch (static_cast<StoreCommand>(cmd)) {
        case StoreCommand::Set: {
          std::string key = in.str();
          std::string value = in.str();
          {
            std::lock_guard<std::mutex> lock(mutex_);
            data_[key] = std::move(value);
          }
          changed_.notify_all();
          put_u8(reply, 0);
          break;
        }
        case StoreCommand::Get: {
          std::string key = in.str();
          auto timeout_ms = in.pod<int64_t>();
          std::unique_lock<std::mutex> lock(mutex_);
          auto missing = wait_keys(lock, {key}, timeout_ms);
          put_u8(reply, missing.empty() ? kStoreOk : (stopping_ ? kStoreShuttingDown : kStoreTimedOut));
          put_str(reply, missing.empty() ? data_[key] : std::string());
          break;
        }
        case StoreCommand::Add: {
          std::string key = in.str();
          auto delta = in.pod<int64_t>();
          int64_t value = 0;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            auto it = data_.find(key);
            if (it != data_.end()) value = std::stoll(it->second);
            value += delta;
            data_[key] = std::to_string(value);
          }
          changed_.notify_all();
          put_i64(reply, value);
          break;
        }
        case StoreCommand::Check:
        case StoreCommand::Wait: {
          auto n = in.pod<uint32_t>();
          std::vector<std::string> keys(n);
          for (auto& k : keys) k = in.str();
          int64_t timeout_ms = 0;
          if (static_cast<StoreCommand>(cmd) == StoreCommand::Wait) timeout_ms = in.pod<int64_t>();
          std::unique_lock<std::mutex> lock(mutex_);
          auto missing = wait_keys(lock, keys, timeout_ms);
          put_u8(reply, missing.empty() ? kStoreOk : (stopping_ ? kStoreShuttingDown : kStoreTimedOut));
          put_u32(reply, static_cast<uint32_t>(missing.size()));
          for (const auto& k : missing) put_str(reply, k);
          break;
        }
        case StoreCommand::Remove: {
          std::string key = in.str();
          std::lock_guard<std::mutex> lock(mutex_);
          put_u8(reply, data_.erase(key) > 0 ? 1 : 0);
          break;
        }
        default:
          return;  // not our protocol: drop the connection
      }
      net::send_all(fd, reply.data(), reply.size(), "store server reply");
    }
  } catch (const std::exception&) {
    // The client closed or broke its connection; other clients are unaffected.
  }
}

}  // namespace dpt::dist
