#include "rendezvous/env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace dpt::dist {
namespace {

std::optional<std::string> get(const EnvLookup& lookup, const char* name) {
  const char* v = lookup(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& text, const char* name) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  DPT_CHECK(errno == 0 && end != text.c_str() && *end == '\0' && v >= -2147483647L && v <= 2147483647L,
            "environment variable {} must be an integer, found '{}'", name, text);
  return static_cast<int>(v);
}

int required_int(const EnvLookup& lookup, const char* name, const char* because) {
  auto v = get(lookup, name);
  DPT_CHECK(v.has_value(), "environment variable {} is not set, but {} is", name, because);
  return parse_int(*v, name);
}

int optional_int(const EnvLookup& lookup, const char* name, int fallback) {
  auto v = get(lookup, name);
  return v ? parse_int(*v, name) : fallback;
}

void validate(const DistEnv& e) {
  DPT_CHECK(e.world_size >= 1, "world size must be >= 1, found {} (from {} variables)", e.world_size, e.source);
  DPT_CHECK(e.rank >= 0 && e.rank < e.world_size, "rank must be in [0, {}), found {} (from {} variables)",
            e.world_size, e.rank, e.source);
  DPT_CHECK(e.local_world_size >= 1 && e.local_world_size <= e.world_size,
            "local world size must be in [1, world size {}], found {} (from {} variables)", e.world_size,
            e.local_world_size, e.source);
  DPT_CHECK(e.local_rank >= 0 && e.local_rank < e.local_world_size,
            "local rank must be in [0, local world size {}), found {} (from {} variables)", e.local_world_size,
            e.local_rank, e.source);
  DPT_CHECK(e.master_port > 0 && e.master_port < 65536, "MASTER_PORT must be in [1, 65535], found {}",
            e.master_port);
  DPT_CHECK(!e.master_addr.empty(), "master address is empty (from {} variables)", e.source);
}

// Master address for launchers that do not set one. A job confined to one node can use loopback;
// a multi-node job needs an address that every node can reach.
std::string master_or_loopback(const EnvLookup& lookup, const DistEnv& e, const char* hint) {
  if (auto a = get(lookup, "MASTER_ADDR")) return *a;
  DPT_CHECK(e.local_world_size == e.world_size,
            "MASTER_ADDR is not set and the job spans several nodes ({} ranks, {} on this node); {}", e.world_size,
            e.local_world_size, hint);
  return "127.0.0.1";
}

// The id every rank of this job shares (see env.h); `source` gets the variable it came from.
std::string job_id(const EnvLookup& lookup, int world_size, std::string& source) {
  for (const char* name : {"DPT_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
    if (auto v = get(lookup, name)) {
      source = name;
      return *v;
    }
  }
  if (auto job = get(lookup, "SLURM_JOB_ID")) {
    source = "SLURM_JOB_ID";
    auto step = get(lookup, "SLURM_STEP_ID");
    return "slurm-" + *job + (step ? "." + *step : "");
  }
  for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"}) {
    if (auto v = get(lookup, name)) {
      source = name;
      return "mpi-" + *v;
    }
  }
  source = "default";
  return "world" + std::to_string(world_size);
}

}  // namespace

std::string DistEnv::describe() const {
  return fmt::format("rank {}/{} (local {}/{}) master {}:{} via {}", rank, world_size, local_rank,
                     local_world_size, master_addr, master_port, source);
}

std::string first_slurm_host(const std::string& hostlist) {
  // Cut the first comma-separated entry, taking care not to cut inside brackets.
  std::string entry;
  int depth = 0;
  for (char c : hostlist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    entry += c;
  }
  auto open = entry.find('[');
  if (open == std::string::npos) return entry;
  std::string prefix = entry.substr(0, open);
  std::string range = entry.substr(open + 1);
  size_t end = range.find_first_of(",-]");
  DPT_CHECK(end != std::string::npos && end > 0, "cannot parse Slurm hostlist '{}'", hostlist);
  return prefix + range.substr(0, end);  // keeps zero padding: "node[03-05]" -> "node03"
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id) {
  // Entries "N" or "N(xK)" separated by commas; entry i covers the next K nodes.
  int node = 0;
  size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    size_t comma = tasks_per_node.find(',', pos);
    std::string item = tasks_per_node.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int count = 0, repeat = 1;
    auto paren = item.find("(x");
    count = parse_int(item.substr(0, paren), "SLURM_TASKS_PER_NODE");
    if (paren != std::string::npos) {
      auto close = item.find(')', paren);
      DPT_CHECK(close != std::string::npos, "cannot parse SLURM_TASKS_PER_NODE '{}'", tasks_per_node);
      repeat = parse_int(item.substr(paren + 2, close - paren - 2), "SLURM_TASKS_PER_NODE");
    }
    if (node_id < node + repeat) return count;
    node += repeat;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  DPT_FAIL("SLURM_TASKS_PER_NODE '{}' lists {} nodes, but this is node {}", tasks_per_node, node, node_id);
}

DistEnv parse_dist_env(const EnvLookup& lookup) {
  DistEnv e;
  e.restart_count = optional_int(lookup, "DPT_RESTART_COUNT", 0);
  DPT_CHECK(e.restart_count >= 0, "DPT_RESTART_COUNT must be >= 0, found {}", e.restart_count);

  if (get(lookup, "RANK") || get(lookup, "WORLD_SIZE")) {
    // The same variables from either launcher; only dpt-run sets DPT_MAX_RESTARTS.
    e.source = get(lookup, "DPT_MAX_RESTARTS") ? "dpt-run" : "torchrun";
    e.rank = required_int(lookup, "RANK", "WORLD_SIZE");
    e.world_size = required_int(lookup, "WORLD_SIZE", "RANK");
    e.local_rank = optional_int(lookup, "LOCAL_RANK", e.world_size == 1 ? 0 : -1);
    DPT_CHECK(e.local_rank >= 0 || get(lookup, "LOCAL_RANK"),
              "environment variable LOCAL_RANK is not set, but RANK={} and WORLD_SIZE={} are", e.rank,
              e.world_size);
    // LOCAL_WORLD_SIZE is newer than the others; without it assume one node.
    e.local_world_size = optional_int(lookup, "LOCAL_WORLD_SIZE", e.world_size);
    e.node_rank = optional_int(lookup, "GROUP_RANK", e.rank / e.local_world_size);
    e.master_addr = get(lookup, "MASTER_ADDR").value_or("127.0.0.1");
    if (e.world_size > 1 && !get(lookup, "MASTER_ADDR") && e.local_world_size != e.world_size) {
      DPT_FAIL("MASTER_ADDR is not set, but WORLD_SIZE={} spans several nodes (LOCAL_WORLD_SIZE={})",
               e.world_size, e.local_world_size);
    }
    e.master_port = optional_int(lookup, "MASTER_PORT", kDefaultMasterPort);
  } else if (get(lookup, "SLURM_PROCID")) {
    e.source = "slurm";
    e.rank = required_int(lookup, "SLURM_PROCID", "SLURM_PROCID");
    e.world_size = required_int(lookup, "SLURM_NTASKS", "SLURM_PROCID");
    e.local_rank = required_int(lookup, "SLURM_LOCALID", "SLURM_PROCID");
    e.node_rank = optional_int(lookup, "SLURM_NODEID", 0);
    if (auto per_node = get(lookup, "SLURM_NTASKS_PER_NODE")) {
      e.local_world_size = slurm_tasks_on_node(*per_node, 0);  // same count on every node by definition
    } else if (auto tasks = get(lookup, "SLURM_STEP_TASKS_PER_NODE")) {
      e.local_world_size = slurm_tasks_on_node(*tasks, e.node_rank);
    } else if (auto tasks2 = get(lookup, "SLURM_TASKS_PER_NODE")) {
      e.local_world_size = slurm_tasks_on_node(*tasks2, e.node_rank);
    } else {
      e.local_world_size = e.world_size;
    }
    if (auto a = get(lookup, "MASTER_ADDR")) {
      e.master_addr = *a;
    } else if (auto nodes = get(lookup, "SLURM_STEP_NODELIST")) {
      e.master_addr = first_slurm_host(*nodes);
    } else if (auto jnodes = get(lookup, "SLURM_JOB_NODELIST")) {
      e.master_addr = first_slurm_host(*jnodes);
    } else if (auto ip = get(lookup, "SLURM_LAUNCH_NODE_IPADDR")) {
      e.master_addr = *ip;
    } else {
      e.master_addr = master_or_loopback(lookup, e, "set MASTER_ADDR to rank 0's host");
    }
    e.master_port = optional_int(lookup, "MASTER_PORT", kDefaultMasterPort);
  } else if (get(lookup, "OMPI_COMM_WORLD_RANK")) {
    e.source = "openmpi";
    e.rank = required_int(lookup, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK");
    e.world_size = required_int(lookup, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK");
    e.local_rank = required_int(lookup, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK");
    e.local_world_size = required_int(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK");
    e.node_rank = optional_int(lookup, "OMPI_COMM_WORLD_NODE_RANK", e.rank / std::max(1, e.local_world_size));
    e.master_addr = master_or_loopback(lookup, e, "pass -x MASTER_ADDR=<rank 0's host> to mpirun");
    e.master_port = optional_int(lookup, "MASTER_PORT", kDefaultMasterPort);
  } else {
    if (auto a = get(lookup, "MASTER_ADDR")) e.master_addr = *a;
    e.master_port = optional_int(lookup, "MASTER_PORT", kDefaultMasterPort);
  }
  validate(e);
  e.job_id = job_id(lookup, e.world_size, e.job_id_source);
  e.store_fd = optional_int(lookup, "DPT_STORE_FD", -1);
  DPT_CHECK(e.store_fd >= -1, "DPT_STORE_FD must be a file descriptor, found {}", e.store_fd);
  e.error_file = get(lookup, "DPT_ERROR_FILE").value_or("");
  e.heartbeat_file = get(lookup, "DPT_HEARTBEAT_FILE").value_or("");
  return e;
}

DistEnv read_dist_env() {
  return parse_dist_env([](const char* name) { return std::getenv(name); });
}

void report_error_to_launcher(const std::string& message) {
  const char* path = std::getenv("DPT_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  auto now = std::chrono::system_clock::now().time_since_epoch();
  std::ofstream out(path, std::ios::trunc);
  out << std::chrono::duration_cast<std::chrono::nanoseconds>(now).count() << "\n" << message;
}

std::optional<ErrorReport> read_error_report(const std::string& path) {
  std::ifstream in(path);
  ErrorReport r;
  if (!(in >> r.time_ns)) return std::nullopt;
  in.get();  // the newline after the time
  std::stringstream rest;
  rest << in.rdbuf();
  r.message = rest.str();
  return r;
}

Heartbeat::Heartbeat(std::string path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DPT_CHECK(fd_ >= 0, "cannot create the heartbeat file {} (DPT_HEARTBEAT_FILE): {}", path, std::strerror(errno));
  std::string pid = std::to_string(::getpid()) + "\n";
  [[maybe_unused]] ssize_t k = ::write(fd_, pid.data(), pid.size());
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, kInterval, [this] { return stop_; })) ::futimens(fd_, nullptr);
  });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  ::close(fd_);
}

}  // namespace dpt::dist
