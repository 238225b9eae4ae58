#pragma once
// Small POSIX TCP helpers shared by the store's client and server and by dpt-run.
//
// Every call that can block is bounded twice: by its deadline, and by the process's stop request
// (set_stop_check): a rank waiting for peers that never come must still leave promptly on SIGINT or
// SIGTERM instead of sitting out the whole rendezvous timeout.
#include <chrono>
#include <cstddef>
#include <string>

#include "core/error.h"

namespace dpt::dist {

// Thrown by a blocking rendezvous call that gave way to a stop request; `signal` is the one received.
class InterruptedError : public dpt::Error {
 public:
  InterruptedError(const std::string& message, int signal) : dpt::Error(message), signal(signal) {}
  int signal;
};

// The process's stop request: returns the signal that asked this process to stop, or 0. A program that
// handles SIGINT/SIGTERM itself (the trainer does) registers its flag here; without one nothing is
// checked (the default actions of those signals end the process anyway). Blocking socket calls poll it
// and throw InterruptedError once a stop has been pending for kStopGrace: a call that is about to
// complete anyway (peers present, a reply on its way) still completes, so an orderly stop that talks to
// the store is not cut short.
using StopCheck = int (*)();
void set_stop_check(StopCheck check);
int stop_requested();  // the registered check's answer, 0 without one
inline constexpr std::chrono::milliseconds kStopGrace{500};

namespace net {

using Clock = std::chrono::steady_clock;

// now + `timeout`, saturating at the clock's maximum instead of overflowing.
Clock::time_point deadline_after(std::chrono::milliseconds timeout);

// An IPv4 socket bound to `port` (0: any free port) on all interfaces, or on 127.0.0.1 only, and not yet
// listening: connections to it are refused until start_listening. Throws naming the port on failure.
int bind_tcp(int port, bool loopback_only = false);
void start_listening(int fd, int backlog = 512);
int bound_port(int fd);  // the local port a socket is bound to
// "10.0.0.2:41234": the far end of a connected socket (for messages about that peer).
std::string peer_address(int fd);
void set_nonblocking(int fd);

// Connects to host:port, retrying (connection refused, host not yet up) until `deadline`.
// Throws a dpt::Error naming host:port, the time waited and the last system error.
int connect_tcp(const std::string& host, int port, Clock::time_point deadline);

// Writes all of `data` before `deadline` (a peer that stops reading cannot hold us); throws on error or
// at the deadline (what names the peer and the request).
void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& what);

// Reads exactly n bytes. Returns false on a clean close before the first byte; throws on errors, on a
// close mid-message, and when `deadline` passes.
bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what);

// Address of this host as seen on the route to `peer_host` (for binding Gloo's listening socket to an
// interface the peers can reach). Falls back to "127.0.0.1" for a loopback peer.
std::string local_address_towards(const std::string& peer_host);

void close_fd(int fd);

}  // namespace net
}  // namespace dpt::dist
