#pragma once
// Which worker caused a group's failure. The first worker to exit is often not it: a rank that hits its
// own error (a full disk, say) tears down its connections while it unwinds, and a peer that notices
// the closed connection can fail and exit first. So workers report their error with the time it
// happened (DPT_ERROR_FILE, see rendezvous/env.h), and errors that only say a peer went away are
// consequences, not causes.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/env.h"

namespace dpt::run {

struct WorkerOutcome {
  int rank = -1;
  bool failed = false;             // a non-zero exit or a signal
  bool ended_by_launcher = false;  // it ended after dpt-run began stopping the group
  int64_t exit_time_ns = 0;        // wall clock when dpt-run saw it end
  std::optional<dist::ErrorReport> report;
  double stalled_s = 0;  // when the group's first failure came: how long it had been stalled
  std::string stall;     // how it was seen stalling ("stopped by SIGSTOP", ...)
};

struct RootCause {
  size_t index = 0;    // into the outcomes
  std::string reason;  // why this worker, in a few words
  // Whether its reported error tells what went wrong. A stalled rank's error, if it has one, came after
  // the others had given up on it.
  bool report_is_cause = true;
};

// True for an error that only reports the loss of a peer (a closed connection, a timeout waiting for
// other ranks, the store's host gone): another rank's failure explains it.
bool lost_a_peer(const std::string& message);

// In order: the earliest error of a worker's own (reported, or a death nobody asked for); else the
// worker that had stalled longest; else the earliest error reported; else the first worker to fail.
// nullopt when no worker failed.
std::optional<RootCause> find_root_cause(const std::vector<WorkerOutcome>& outcomes);

}  // namespace dpt::run
