#pragma once
// Small POSIX TCP helpers shared by the store's client and server and by dpt-run.
#include <chrono>
#include <cstddef>
#include <string>

namespace dpt::dist::net {

using Clock = std::chrono::steady_clock;

// Listening IPv4 socket on all interfaces; port 0 picks a free one. Throws naming the port on failure.
int listen_tcp(int port, int backlog = 512);
int bound_port(int fd);  // the local port a socket is bound to

// Connects to host:port, retrying (connection refused, host not yet up) until `deadline`.
// Throws a dpt::Error naming host:port, the time waited and the last system error.
int connect_tcp(const std::string& host, int port, Clock::time_point deadline);

// Writes all of `data`; throws on error (what names the peer and the request).
void send_all(int fd, const void* data, size_t n, const std::string& what);

// Reads exactly n bytes. Returns false on a clean close before the first byte; throws on errors, on a
// close mid-message, and when `deadline` passes.
bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what);

// Address of this host as seen on the route to `peer_host` (for binding Gloo's listening socket to an
// interface the peers can reach). Falls back to "127.0.0.1" for a loopback peer.
std::string local_address_towards(const std::string& peer_host);

// Free TCP port on this host (bind to port 0, read it back, close).
int find_free_port();

void close_fd(int fd);

}  // namespace dpt::dist::net
