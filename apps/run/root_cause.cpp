#include "root_cause.h"

namespace dpt::run {

bool lost_a_peer(const std::string& message) {
  // Phrases of Gloo's transport, our Gloo and NCCL backends and the store when the other side is gone
  // or silent; see collectives/gloo_backend.cpp and nccl_backend.cpp, and rendezvous/tcp_store.cpp.
  static const char* const kMarkers[] = {
      "Connection closed by peer",
      "Connection reset by peer",
      "Broken pipe",
      "has exited or been killed",
      "which hosts the store, shut down",
      "the store closed the connection",
      "the process group failed earlier",
      "the process group is being destroyed",
      "ranks never arrived",
      "timed out",
      "Timed out",
      "did not complete within the timeout",
      "remote process exited",
  };
  for (const char* m : kMarkers)
    if (message.find(m) != std::string::npos) return true;
  return false;
}

std::optional<RootCause> find_root_cause(const std::vector<WorkerOutcome>& outcomes) {
  std::optional<RootCause> best;
  int64_t best_time = 0;
  auto consider = [&](size_t i, int64_t time, const char* reason) {
    if (!best || time < best_time) {
      best = RootCause{i, reason};
      best_time = time;
    }
  };
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const auto& o = outcomes[i];
    if (o.report && !lost_a_peer(o.report->message)) {
      consider(i, o.report->time_ns, "its own error came first");
    } else if (o.failed && !o.report && !o.ended_by_launcher) {
      consider(i, o.exit_time_ns, "it ended before any other rank reported an error of its own");
    }
  }
  if (best) return best;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const auto& o = outcomes[i];
    if (o.stalled_s > 0 && (!best || o.stalled_s > outcomes[best->index].stalled_s))
      best = RootCause{i, "it stopped making progress (" + o.stall + "); the others failed waiting for it", false};
  }
  if (best) return best;
  for (size_t i = 0; i < outcomes.size(); ++i)
    if (outcomes[i].report) consider(i, outcomes[i].report->time_ns, "the first to report an error (it lost a peer)");
  if (best) return best;
  for (size_t i = 0; i < outcomes.size(); ++i)
    if (outcomes[i].failed) consider(i, outcomes[i].exit_time_ns, "the first worker to fail");
  return best;
}

}  // namespace dpt::run
