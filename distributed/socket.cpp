#include "distributed/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace dpt::dist::net {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000000 ? 1000000 : static_cast<int>(left);
}

}  // namespace

void close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

int listen_tcp(int port, int backlog) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DPT_CHECK(fd >= 0, "socket() failed: {}", errno_text(errno));
  int one = 1;
  // Reuse the port while connections of a previous attempt linger in TIME_WAIT (dpt-run restarts).
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    DPT_FAIL("cannot listen on TCP port {}: {} (is another job using this port? choose another MASTER_PORT)",
             port, errno_text(err));
  }
  if (::listen(fd, backlog) != 0) {
    int err = errno;
    ::close(fd);
    DPT_FAIL("listen() on TCP port {} failed: {}", port, errno_text(err));
  }
  return fd;
}

int bound_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  DPT_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname failed: {}",
            errno_text(errno));
  return ntohs(addr.sin_port);
}

int connect_tcp(const std::string& host, int port, Clock::time_point deadline) {
  auto start = Clock::now();
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
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
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
          last_error = errno_text(errno);
          continue;
        }
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
          return fd;
        }
        last_error = errno_text(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  DPT_FAIL("cannot connect to the store at {}:{} after {} ms: {} (is rank 0 running, and are MASTER_ADDR and "
           "MASTER_PORT right?)",
           host, port, waited, last_error);
}

void send_all(int fd, const void* data, size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
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
    pollfd pfd{fd, POLLIN, 0};
    int ms = remaining_ms(deadline);
    int rc = ::poll(&pfd, 1, ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      DPT_FAIL("{}: poll failed: {}", what, errno_text(errno));
    }
    if (rc == 0) DPT_FAIL("{}: no reply before the deadline", what);
    ssize_t k = ::recv(fd, p + got, n - got, 0);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
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

int find_free_port() {
  int fd = listen_tcp(0, 1);
  int port = bound_port(fd);
  ::close(fd);
  return port;
}

}  // namespace dpt::dist::net
