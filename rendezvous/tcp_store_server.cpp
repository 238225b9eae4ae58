#include "rendezvous/tcp_store_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "rendezvous/socket.h"
#include "rendezvous/store_protocol.h"

namespace dpt::dist {
namespace {

using namespace store_wire;
using Clock = std::chrono::steady_clock;
using Milliseconds = std::chrono::milliseconds;

constexpr size_t kReadChunk = 64 * 1024;
// Longest poll(): bounds how late a deadline can be noticed if the computed wake-up were ever off.
constexpr int kMaxPollMs = 1000;
// Warnings about dropped peers: every one up to this count, then one in kWarnEvery (a flood of
// connections must not flood the log).
constexpr int64_t kWarnAll = 20;
constexpr int64_t kWarnEvery = 1000;

struct Connection {
  uint64_t id = 0;
  int fd = -1;
  std::string peer;  // "10.0.0.2:41234"
  bool welcomed = false;
  int rank = -1;
  bool dead = false;
  bool close_after_reply = false;  // a refused hello: its reply goes out, then the connection closes
  Clock::time_point opened;
  Clock::time_point last_progress;  // last byte received or sent
  std::string in;                   // bytes of the message being received
  std::string out;                  // reply being sent ...
  size_t out_done = 0;              // ... and how much of it has gone
  // A parked get/wait.
  bool waiting = false;
  uint64_t wait_id = 0;
  Request request;
  Clock::time_point deadline;
  size_t missing = 0;  // keys of `request` that were absent when last counted

  bool sending() const { return out_done < out.size(); }
  bool busy() const { return waiting || sending(); }
  std::string who() const {
    return welcomed ? fmt::format("rank {} at {}", rank, peer) : fmt::format("the connection from {}", peer);
  }
};

Clock::time_point saturating_add(Clock::time_point t, Milliseconds d) {
  auto room = std::chrono::duration_cast<Milliseconds>(Clock::time_point::max() - t);
  return d >= room ? Clock::time_point::max() : t + d;
}

}  // namespace

class TcpStoreServer::Loop {
 public:
  Loop(int listen_fd, int wake_fd, const TcpStoreServerOptions& options, int port)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        options_(options),
        port_(port),
        max_members_(2 * static_cast<size_t>(std::max(1, options.world_size)) + 16) {}

  ~Loop() {
    for (auto& [id, c] : conns_) net::close_fd(c->fd);
    net::close_fd(listen_fd_);
  }

  void run(const std::atomic<bool>& stopping) {
    std::vector<pollfd> fds;
    std::vector<Connection*> polled;
    while (true) {
      auto now = Clock::now();
      fds.clear();
      polled.clear();
      fds.push_back({wake_fd_, POLLIN, 0});
      bool accepting = now >= accept_paused_until_;
      if (accepting) fds.push_back({listen_fd_, POLLIN, 0});
      for (auto& [id, c] : conns_) {
        // A busy connection is not read: one request at a time, and a peer that pipelines requests
        // without reading replies cannot make us buffer them. Its hang-up is still seen (POLLRDHUP).
        short events = POLLRDHUP;
        if (!c->busy()) events |= POLLIN;
        if (c->sending()) events |= POLLOUT;
        fds.push_back({c->fd, events, 0});
        polled.push_back(c.get());
      }
      int rc = ::poll(fds.data(), fds.size(), next_wake_ms(now));
      if (rc < 0 && errno != EINTR) {
        spdlog::error("{}: poll failed: {}; the store stops serving", name(), std::strerror(errno));
        return;
      }
      if (stopping.load()) {
        shut_down();
        return;
      }
      if (rc > 0) {
        if (fds[0].revents & POLLIN) {
          uint64_t v = 0;
          [[maybe_unused]] ssize_t k = ::read(wake_fd_, &v, sizeof(v));
        }
        // Connections already open go first: a flood of newcomers must not push them out before
        // their hello has been read.
        size_t first = accepting ? 2 : 1;
        for (size_t i = first; i < fds.size(); ++i) on_events(*polled[i - first], fds[i].revents);
        if (accepting && (fds[1].revents & POLLIN)) accept_new();
      }
      for (auto& [id, c] : conns_) serve(*c);
      settle_deadlines();
      expire();
      sweep();
    }
  }

 private:
  std::string name() const { return fmt::format("TCP store on port {}", port_); }

  // One warning per dropped or refused peer, thinned out during a flood.
  void warn(const std::string& text) {
    ++warnings_;
    if (warnings_ <= kWarnAll) {
      spdlog::warn("{}: {}", name(), text);
    } else if (warnings_ % kWarnEvery == 0) {
      spdlog::warn("{}: {} (warning {}; the others since the first {} are not shown)", name(), text, warnings_,
                   kWarnAll);
    }
  }

  void drop(Connection& c, const std::string& why) {
    if (c.dead) return;
    if (!why.empty()) warn(fmt::format("dropped {}: {}", c.who(), why));
    c.dead = true;
    c.waiting = false;
    net::close_fd(c.fd);
    c.fd = -1;
  }

  size_t count_strangers() const {
    size_t n = 0;
    for (const auto& [id, c] : conns_) n += (!c->dead && !c->welcomed) ? 1 : 0;
    return n;
  }

  // Drops the unintroduced connection that has waited longest, a silent one before one that has sent
  // part of a hello (room for a newcomer); false if there is none.
  bool evict_oldest_stranger(const std::string& why) {
    Connection* oldest = nullptr;
    auto before = [](const Connection& a, const Connection& b) {
      return std::make_pair(!a.in.empty(), a.opened) < std::make_pair(!b.in.empty(), b.opened);
    };
    for (auto& [id, c] : conns_)
      if (!c->dead && !c->welcomed && (oldest == nullptr || before(*c, *oldest))) oldest = c.get();
    if (oldest == nullptr) return false;
    drop(*oldest, why);
    return true;
  }

  void accept_new() {
    // A bounded batch per round keeps the other connections served during a connection flood.
    for (int i = 0; i < 64; ++i) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: make room from strangers, else wait a moment (the pending connection
          // stays in the backlog; retrying at once would spin).
          const int err = errno;
          if (!evict_oldest_stranger("the process is out of file descriptors")) {
            accept_paused_until_ = Clock::now() + Milliseconds(100);
            warn(fmt::format("cannot accept connections: {}", std::strerror(err)));
            return;
          }
          continue;
        }
        return;  // EAGAIN: no more pending
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
      if (count_strangers() >= static_cast<size_t>(kMaxStrangers))
        evict_oldest_stranger(fmt::format("sent no hello while {} newer connections waited", kMaxStrangers));
      auto c = std::make_unique<Connection>();
      c->id = next_id_++;
      c->fd = fd;
      c->peer = net::peer_address(fd);
      c->opened = c->last_progress = Clock::now();
      // A rank sends its hello right after connecting: it is usually here already.
      read_some(*c);
      serve(*c);
      conns_.emplace(c->id, std::move(c));
    }
  }

  void on_events(Connection& c, short revents) {
    if (c.dead) return;
    if (revents & (POLLERR | POLLNVAL)) return drop(c, "");
    if (revents & POLLOUT) flush(c);
    if (c.dead) return;
    if ((revents & POLLIN) && !c.busy()) {
      read_some(c);
    } else if (revents & (POLLHUP | POLLRDHUP)) {
      drop(c, "");  // went away, maybe while its request waited: nobody is left to answer
    }
  }

  void read_some(Connection& c) {
    const size_t limit = c.welcomed ? kMaxRequestBytes : kHelloBytesMax;
    size_t room = std::min(kReadChunk, limit + 1 - std::min(limit, c.in.size()));
    size_t old = c.in.size();
    c.in.resize(old + room);
    ssize_t k = ::recv(c.fd, c.in.data() + old, room, 0);
    if (k <= 0) {
      c.in.resize(old);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      // Closed (or reset) by the peer. Going away between requests is normal; halfway through one is not.
      return drop(c, c.in.empty() ? std::string() : "closed its connection in the middle of a message");
    }
    c.in.resize(old + static_cast<size_t>(k));
    c.last_progress = Clock::now();
  }

  // Handles every complete message the connection has sent, one at a time.
  void serve(Connection& c) {
    while (!c.dead && !c.busy() && !c.close_after_reply && !c.in.empty()) {
      ParseResult r;
      if (!c.welcomed) {
        Hello hello;
        r = parse_hello(c.in, hello);
        if (r.state == Parsed::Complete) greet(c, hello);
      } else {
        r = parse_request(c.in, c.request);
        if (r.state == Parsed::Complete) handle(c);
      }
      if (r.state == Parsed::Incomplete) {
        if (c.in.size() > (c.welcomed ? kMaxRequestBytes : kHelloBytesMax)) drop(c, "a message beyond every bound");
        return;
      }
      if (r.state == Parsed::Invalid) return drop(c, r.why);
      c.in.erase(0, r.used);
    }
  }

  void greet(Connection& c, const Hello& hello) {
    std::string refusal;
    HelloStatus status = HelloStatus::Welcome;
    if (hello.job_id != options_.job_id) {
      status = HelloStatus::OtherJob;
      refusal = "its job id differs";
    } else if (hello.world_size != options_.world_size) {
      status = HelloStatus::OtherJob;
      refusal = fmt::format("it serves a job of {} ranks, not {}", options_.world_size, hello.world_size);
    } else if (members_ >= max_members_) {
      status = HelloStatus::Busy;
      refusal = fmt::format("it already serves {} connections, the most a job of {} ranks may open", members_,
                            options_.world_size);
    }
    std::string reply;
    put_u32(reply, kMagic);
    put_u8(reply, static_cast<uint8_t>(status));
    put_str(reply, refusal);
    if (status == HelloStatus::Welcome) {
      c.welcomed = true;
      c.rank = hello.rank;
      ++members_;
    } else {
      warn(fmt::format("refused rank {} at {}: {}", hello.rank, c.peer, refusal));
      c.close_after_reply = true;
    }
    send_reply(c, std::move(reply));
  }

  std::vector<std::string> missing_keys(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!data_.count(k)) out.push_back(k);
    return out;
  }

  void handle(Connection& c) {
    Request& q = c.request;
    std::string reply;
    switch (q.command) {
      case Command::Set:
        store(q.keys[0], std::move(q.value));
        put_u8(reply, static_cast<uint8_t>(Status::Ok));
        break;
      case Command::Get:
      case Command::Wait:
        return park(c);
      case Command::Add: {
        auto it = data_.find(q.keys[0]);
        int64_t value = 0;
        if (it != data_.end()) {
          const std::string& s = it->second;
          auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
          if (ec != std::errc() || end != s.data() + s.size()) {
            put_u8(reply, static_cast<uint8_t>(Status::Error));
            put_str(reply, fmt::format("add '{}': its value is not an integer", q.keys[0]));
            break;
          }
        }
        if (__builtin_add_overflow(value, q.number, &value)) {
          put_u8(reply, static_cast<uint8_t>(Status::Error));
          put_str(reply, fmt::format("add '{}': the sum overflows a 64-bit integer", q.keys[0]));
          break;
        }
        store(q.keys[0], std::to_string(value));
        put_u8(reply, static_cast<uint8_t>(Status::Ok));
        put_i64(reply, value);
        break;
      }
      case Command::Check: {
        auto missing = missing_keys(q.keys);
        put_u8(reply, static_cast<uint8_t>(Status::Ok));
        put_u32(reply, static_cast<uint32_t>(missing.size()));
        for (const auto& k : missing) put_str(reply, k);
        break;
      }
      case Command::Remove:
        put_u8(reply, static_cast<uint8_t>(Status::Ok));
        put_u8(reply, data_.erase(q.keys[0]) > 0 ? 1 : 0);
        break;
    }
    send_reply(c, std::move(reply));
  }

  void store(const std::string& key, std::string value) {
    auto [it, inserted] = data_.insert_or_assign(key, std::move(value));
    if (inserted) key_appeared(key);
  }

  // A get or wait: answered now if its keys exist, else parked, each missing key watched.
  void park(Connection& c) {
    c.waiting = true;
    c.wait_id = next_wait_id_++;
    c.deadline = saturating_add(Clock::now(), Milliseconds(c.request.number));
    c.missing = 0;
    for (const auto& k : c.request.keys) {
      if (data_.count(k)) continue;
      ++c.missing;
      watchers_[k].push_back({c.id, c.wait_id});
    }
    if (c.missing == 0) answer_wait(c, Status::Ok);
  }

  void key_appeared(const std::string& key) {
    auto it = watchers_.find(key);
    if (it == watchers_.end()) return;
    auto list = std::move(it->second);
    watchers_.erase(it);
    for (const auto& [conn_id, wait_id] : list) {
      auto c = conns_.find(conn_id);
      if (c == conns_.end() || !c->second->waiting || c->second->wait_id != wait_id) continue;
      Connection& w = *c->second;
      if (--w.missing > 0) continue;
      // Counted out; a key removed meanwhile would still be absent, so look again before answering.
      if (missing_keys(w.request.keys).empty()) {
        answer_wait(w, Status::Ok);
      } else {
        w.waiting = false;
        park(w);
      }
    }
  }

  void answer_wait(Connection& c, Status status) {
    c.waiting = false;
    std::string reply;
    put_u8(reply, static_cast<uint8_t>(status));
    if (c.request.command == Command::Get) {
      put_str(reply, status == Status::Ok ? data_.at(c.request.keys[0]) : std::string());
    } else {
      auto missing = status == Status::Ok ? std::vector<std::string>{} : missing_keys(c.request.keys);
      put_u32(reply, static_cast<uint32_t>(missing.size()));
      for (const auto& k : missing) put_str(reply, k);
    }
    send_reply(c, std::move(reply));
  }

  void send_reply(Connection& c, std::string reply) {
    c.out = std::move(reply);
    c.out_done = 0;
    flush(c);
  }

  // Sends what the socket takes now; the rest waits for POLLOUT.
  void flush(Connection& c) {
    while (!c.dead && c.sending()) {
      ssize_t k = ::send(c.fd, c.out.data() + c.out_done, c.out.size() - c.out_done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return drop(c, "");  // gone
      }
      c.out_done += static_cast<size_t>(k);
      c.last_progress = Clock::now();
    }
    if (c.dead) return;
    c.out.clear();
    c.out_done = 0;
    if (c.close_after_reply) drop(c, "");
  }

  void settle_deadlines() {
    auto now = Clock::now();
    for (auto& [id, c] : conns_)
      if (!c->dead && c->waiting && now >= c->deadline) answer_wait(*c, Status::TimedOut);
  }

  // Drops connections that never said hello, stalled mid-request, or stopped reading replies.
  void expire() {
    auto now = Clock::now();
    for (auto& [id, c] : conns_) {
      if (c->dead) continue;
      if (!c->welcomed && now - c->opened >= options_.hello_timeout) {
        drop(*c, fmt::format("sent no hello within {} ms", options_.hello_timeout.count()));
      } else if (c->sending() && now - c->last_progress >= options_.stall_timeout) {
        drop(*c, fmt::format("stopped reading its replies for {} ms", options_.stall_timeout.count()));
      } else if (!c->busy() && !c->in.empty() && now - c->last_progress >= options_.stall_timeout) {
        drop(*c, fmt::format("sent half a request, then nothing for {} ms", options_.stall_timeout.count()));
      }
    }
  }

  void sweep() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second->dead) {
        if (it->second->welcomed) --members_;
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  int next_wake_ms(Clock::time_point now) const {
    Clock::time_point wake = now + Milliseconds(kMaxPollMs);
    if (!(now >= accept_paused_until_)) wake = std::min(wake, accept_paused_until_);
    for (const auto& [id, c] : conns_) {
      if (c->dead) continue;
      if (c->waiting) wake = std::min(wake, c->deadline);
      if (!c->welcomed) wake = std::min(wake, c->opened + options_.hello_timeout);
      if (c->sending() || !c->in.empty()) wake = std::min(wake, c->last_progress + options_.stall_timeout);
    }
    auto ms = std::chrono::duration_cast<Milliseconds>(wake - now).count() + 1;
    return static_cast<int>(std::clamp<int64_t>(ms, 0, kMaxPollMs));
  }

  // Rank 0 is exiting: parked waits learn it (with the keys still missing, so a client can say which
  // ranks never arrived), in one attempt to send that does not wait for anyone; then every
  // connection closes.
  void shut_down() {
    for (auto& [id, c] : conns_)
      if (!c->dead && c->waiting) answer_wait(*c, Status::ShuttingDown);
    for (auto& [id, c] : conns_) {
      if (c->dead) continue;
      ::shutdown(c->fd, SHUT_WR);
      drop(*c, "");
    }
  }

  int listen_fd_;
  int wake_fd_;
  TcpStoreServerOptions options_;
  int port_;
  size_t max_members_;
  size_t members_ = 0;
  int64_t warnings_ = 0;
  uint64_t next_id_ = 1;
  uint64_t next_wait_id_ = 1;
  Clock::time_point accept_paused_until_{};
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;
  std::unordered_map<std::string, std::string> data_;
  // key -> the parked waits (connection id, wait id) that lack it.
  std::unordered_map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> watchers_;
};

TcpStoreServer::TcpStoreServer(const TcpStoreServerOptions& options) {
  int listen_fd = -1;
  if (options.listen_fd >= 0) {
    // The launcher's socket: a duplicate of our own, so that the launcher's copy (kept across restarts)
    // and any later store in this process can still use it.
    listen_fd = ::fcntl(options.listen_fd, F_DUPFD_CLOEXEC, 0);
    DPT_CHECK(listen_fd >= 0, "the rendezvous socket handed over by the launcher (descriptor {}) is unusable: {}",
              options.listen_fd, std::strerror(errno));
    int bound = -1;
    try {
      bound = net::bound_port(listen_fd);
    } catch (const std::exception&) {
    }
    if (bound <= 0 || (options.port != 0 && bound != options.port)) {
      net::close_fd(listen_fd);
      DPT_FAIL(
          "descriptor {} (DPT_STORE_FD) is not the rendezvous socket of port {}: dpt-run hands it to rank 0, "
          "and it is not meant to be set by hand",
          options.listen_fd, options.port);
    }
  } else {
    listen_fd = net::bind_tcp(options.port);
  }
  try {
    net::start_listening(listen_fd);
    net::set_nonblocking(listen_fd);
    port_ = net::bound_port(listen_fd);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    DPT_CHECK(wake_fd_ >= 0, "eventfd failed: {}", std::strerror(errno));
  } catch (...) {
    net::close_fd(listen_fd);
    throw;
  }
  loop_ = std::make_unique<Loop>(listen_fd, wake_fd_, options, port_);
  thread_ = std::thread([this] { loop_->run(stopping_); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t k = ::write(wake_fd_, &one, sizeof(one));
  thread_.join();
  loop_.reset();
  net::close_fd(wake_fd_);
}

}  // namespace dpt::dist
