#include "rendezvous/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace dpt::dist {
namespace {

std::atomic<StopCheck> g_stop_check{nullptr};

std::string signal_name(int signo) {
  if (signo == SIGINT) return "SIGINT";
  if (signo == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(signo);
}

}  // namespace

void set_stop_check(StopCheck check) { g_stop_check.store(check); }

int stop_requested() {
  StopCheck check = g_stop_check.load();
  return check != nullptr ? check() : 0;
}

namespace net {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Longest single poll(): short enough that a stop request is noticed well within a second.
constexpr int kPollSliceMs = 100;

// Counts the grace of a stop request that arrived while a call was blocked (see kStopGrace).
class StopWatch {
 public:
  explicit StopWatch(const std::string& what) : what_(what) {}
  void check() {
    int signo = stop_requested();
    if (signo == 0) return;
    auto now = Clock::now();
    if (seen_ == Clock::time_point{}) seen_ = now;
    if (now - seen_ >= kStopGrace)
      throw InterruptedError(fmt::format("{}: interrupted by {}", what_, signal_name(signo)), signo);
  }

 private:
  const std::string& what_;
  Clock::time_point seen_{};
};

int slice_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, kPollSliceMs));
}

// Waits until `fd` is ready for `events` (true) or `deadline` passes (false), giving way to a stop.
bool wait_ready(int fd, short events, Clock::time_point deadline, const std::string& what) {
  StopWatch stop(what);
  while (true) {
    stop.check();
    if (Clock::now() >= deadline) return false;
    pollfd pfd{fd, events, 0};
    int rc = ::poll(&pfd, 1, slice_ms(deadline));
    if (rc < 0) {
      if (errno == EINTR) continue;
      DPT_FAIL("{}: poll failed: {}", what, errno_text(errno));
    }
    if (rc > 0) return true;
  }
}

// One non-blocking connect to `ai`, bounded by `deadline`: a blocking connect() to a host that drops
// packets would wait for the kernel's SYN retries (minutes) whatever our deadline says.
int try_connect(const addrinfo* ai, Clock::time_point deadline, const std::string& what, std::string& error) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) {
    error = errno_text(errno);
    return -1;
  }
  int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    bool ready = false;
    try {
      ready = wait_ready(fd, POLLOUT, deadline, what);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (!ready) {
      error = "connection attempt timed out";
      ::close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    error = errno_text(errno);
    ::close(fd);
    return -1;
  }
  // Back to blocking: the callers bound every transfer with poll() themselves.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  return fd;
}

}  // namespace

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  auto now = Clock::now();
  if (timeout.count() <= 0) return now;
  auto room = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

void close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

int bind_tcp(int port, bool loopback_only) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DPT_CHECK(fd >= 0, "socket() failed: {}", errno_text(errno));
  int one = 1;
  // Reuse the port while connections of a previous attempt linger in TIME_WAIT (dpt-run restarts).
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    DPT_FAIL("cannot listen on TCP port {}: {} (is another job using this port? choose another MASTER_PORT)",
             port, errno_text(err));
  }
  return fd;
}

void start_listening(int fd, int backlog) {
  if (::listen(fd, backlog) != 0) {
    int err = errno;
    DPT_FAIL("listen() on TCP port {} failed: {}", bound_port(fd), errno_text(err));
  }
}

int bound_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  DPT_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname failed: {}",
            errno_text(errno));
  return ntohs(addr.sin_port);
}

std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown address";
  char host[NI_MAXHOST] = {}, port[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return std::string(host) + ":" + port;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

int connect_tcp(const std::string& host, int port, Clock::time_point deadline) {
  auto start = Clock::now();
  std::string what = fmt::format("connecting to the store at {}:{}", host, port);
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  StopWatch stop(what);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    std::string port_text = std::to_string(port);
    int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
    if (rc != 0) {
      last_error = std::string("cannot resolve host: ") + gai_strerror(rc);
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        int fd = -1;
        try {
          fd = try_connect(ai, deadline, what, last_error);
        } catch (...) {
          ::freeaddrinfo(res);
          throw;
        }
        if (fd >= 0) {
          ::freeaddrinfo(res);
          return fd;
        }
      }
      ::freeaddrinfo(res);
    }
    // Sleep out the backoff in slices, so that a stop request ends the retries.
    auto wake = Clock::now() + backoff;
    if (wake >= deadline) break;
    while (Clock::now() < wake) {
      stop.check();
      ::poll(nullptr, 0, slice_ms(wake));
    }
    stop.check();
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  DPT_FAIL("cannot connect to the store at {}:{} after {} ms: {} (is rank 0 running, and are MASTER_ADDR and "
           "MASTER_PORT right?)",
           host, port, waited, last_error);
}

void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_ready(fd, POLLOUT, deadline, what))
          DPT_FAIL("{}: the peer stopped reading (send not complete before the deadline)", what);
        continue;
      }
      DPT_FAIL("{}: send failed: {}", what, errno_text(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    if (!wait_ready(fd, POLLIN, deadline, what)) DPT_FAIL("{}: no reply before the deadline", what);
    ssize_t k = ::recv(fd, p + got, n - got, MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      DPT_FAIL("{}: receive failed: {}", what, errno_text(errno));
    }
    if (k == 0) {
      if (got == 0) return false;
      DPT_FAIL("{}: connection closed in the middle of a message", what);
    }
    got += static_cast<size_t>(k);
  }
  return true;
}

std::string local_address_towards(const std::string& peer_host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(peer_host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "127.0.0.1";
  std::string out = "127.0.0.1";
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  // A UDP connect sends nothing; it only asks the kernel for the route, whose source address we read.
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN] = {};
      if (::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

}  // namespace net
}  // namespace dpt::dist
