// dpt-bench collectives: bandwidth and latency of each collective over a range of sizes, in the manner of
// nccl-tests, run under dpt-run:
//   dpt-run --nproc-per-node 2 -- dpt-bench collectives [--backend nccl|gloo] [--ops allreduce,allgather,...]
//       [--min-bytes 1K] [--max-bytes 1G] [--step-factor 2] [--dtype f32|bf16] [--warmup 5] [--iters 20]
//       [--async-op on|off] [--csv FILE]
//
// Size S is the bytes of the whole buffer: for allgather and reduce-scatter that is the gathered (or
// scattered) total, per-rank × n. Time t is the median over --iters runs after --warmup runs, taken
// with CUDA events on the caller's stream for NCCL (each run is issued, then waited on by the stream)
// and with the host clock for Gloo. Like torch.distributed's default (async_op=False), the timed
// collectives run on the caller's stream; --async-op on times them on the communication stream, with
// the two event hops an overlapped collective pays (collectives/process_group.h). algbw = S / t; busbw = algbw ×
// factor, with the nccl-tests factors: allreduce 2(n−1)/n, allgather and reduce-scatter (n−1)/n, broadcast 1.
//
// Correctness: after timing, each (op, size) runs once more on inputs whose exact result is small
// integers, so it does not depend on the order of summation, and every element is compared exactly
// on every rank. A wrong result marks the row FAILED and makes the exit status non-zero.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "collectives/process_group.h"
#include "command_line.h"
#include "core/bfloat16.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/tensor.h"
#include "subcommand.h"

#ifdef DPT_HAVE_CUDA
#include "core/cuda/stream.h"
#endif

namespace dpt::bench {
namespace {

using dist::ProcessGroup;
using dist::ReduceOp;

struct Options {
  std::string backend;  // empty: nccl when a GPU is present, else gloo
  std::vector<std::string> ops = {"allreduce", "allgather", "reduce_scatter", "broadcast"};
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = int64_t{1} << 30;
  int64_t step_factor = 2;
  DType dtype = DType::Float32;
  int warmup = 5;
  int iters = 20;
  bool async_op = false;
  std::string csv;
};

int64_t parse_bytes(const std::string& text) {
  DPT_CHECK(!text.empty(), "empty size");
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  std::string suffix(end);
  int64_t mult = 1;
  if (suffix == "K" || suffix == "KiB" || suffix == "k") mult = int64_t{1} << 10;
  else if (suffix == "M" || suffix == "MiB") mult = int64_t{1} << 20;
  else if (suffix == "G" || suffix == "GiB") mult = int64_t{1} << 30;
  else DPT_CHECK(suffix.empty() || suffix == "B", "size '{}': expected a number with optional K, M or G", text);
  DPT_CHECK(v > 0, "size '{}' must be positive", text);
  return static_cast<int64_t>(v * static_cast<double>(mult));
}

double bus_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reduce_scatter") return static_cast<double>(n - 1) / n;
  return 1.0;
}

// Host tensor of `n` elements, element i = f(i), converted to `dtype`, then moved to `device`.
template <class F>
Tensor pattern(int64_t n, DType dtype, Device device, F f) {
  Tensor t = Tensor::empty({n}, TensorOptions{}.with_dtype(dtype));
  if (dtype == DType::Float32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(f(i));
  } else {
    bf16* p = t.data<bf16>();
    for (int64_t i = 0; i < n; ++i) p[i] = bf16(static_cast<float>(f(i)));
  }
  return t.to(device);
}

// Number of elements that differ from f(i) (exact comparison).
template <class F>
int64_t mismatches(const Tensor& device_tensor, F f) {
  Tensor t = device_tensor.to(Device::cpu());
  int64_t bad = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double got = t.dtype() == DType::Float32 ? static_cast<double>(t.data<float>()[i])
                                             : static_cast<double>(static_cast<float>(t.data<bf16>()[i]));
    if (got != f(i)) ++bad;
  }
  return bad;
}

struct Row {
  std::string op;
  int64_t bytes = 0;
  int64_t count = 0;  // elements of the whole buffer
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  bool ok = true;
};

class Bench {
 public:
  Bench(std::shared_ptr<ProcessGroup> pg, const Options& o, Device device)
      : group_(std::move(pg)), pg_(*group_), o_(o), device_(device) {}

  Row run(const std::string& op, int64_t bytes) {
    const int n = pg_.size(), r = pg_.rank();
    const int64_t elem = static_cast<int64_t>(dtype_size(o_.dtype));
    int64_t count = bytes / elem;
    bool per_rank_split = op == "allgather" || op == "reduce_scatter";
    int64_t chunk = per_rank_split ? count / n : count;
    if (per_rank_split) count = chunk * n;
    Row row{op, count * elem, count};
    if (chunk == 0) return row;

    // Timing buffers: tiny non-zero normal numbers (never zeros, which some hardware moves or reduces
    // faster), so that repeated in-place sums grow by at most n per run and stay finite: from 1e-36,
    // 8 ranks allow over 80 runs before reaching float32's (and bfloat16's) range limit.
    int runs = o_.warmup + o_.iters;
    DPT_CHECK(runs * std::log10(static_cast<double>(n)) < 70, "{} runs on {} ranks would overflow the timing buffers; "
              "use fewer --warmup/--iters", runs, n);
    auto tiny = [](int64_t i) { return 1e-36 * static_cast<double>(1 + i % 7); };
    Tensor full = pattern(count, o_.dtype, device_, tiny);
    Tensor part = per_rank_split ? pattern(chunk, o_.dtype, device_, tiny) : Tensor();
    auto issue = [&]() -> std::shared_ptr<dist::Work> {
      const bool async_op = o_.async_op;
      if (op == "allreduce") return pg_.allreduce(full, ReduceOp::Sum, async_op);
      if (op == "broadcast") return pg_.broadcast(full, 0, async_op);
      if (op == "allgather") return pg_.allgather(full, part, async_op);
      return pg_.reduce_scatter(part, full, ReduceOp::Sum, async_op);
    };
    for (int i = 0; i < o_.warmup; ++i) issue()->wait();
    std::vector<double> times = time_runs(issue);
    std::sort(times.begin(), times.end());
    row.time_us = times[times.size() / 2];
    row.algbw = static_cast<double>(row.bytes) / (row.time_us * 1e-6) / 1e9;
    row.busbw = row.algbw * bus_factor(op, n);

    // Correctness on fresh inputs: small integers, exact in float32 and bfloat16 for any order.
    auto base = [](int64_t i) { return static_cast<double>(i % 3 + 1); };
    const double tri = n * (n + 1) / 2.0;
    int64_t bad = 0;
    if (op == "allreduce") {
      Tensor t = pattern(count, o_.dtype, device_, [&](int64_t i) { return (r + 1) * base(i); });
      pg_.allreduce(t, ReduceOp::Sum)->wait();
      bad = mismatches(t, [&](int64_t i) { return tri * base(i); });
    } else if (op == "broadcast") {
      Tensor t = pattern(count, o_.dtype, device_, [&](int64_t i) { return (r + 1) * base(i); });
      pg_.broadcast(t, 0)->wait();
      bad = mismatches(t, base);
    } else if (op == "allgather") {
      Tensor in = pattern(chunk, o_.dtype, device_, [&](int64_t i) { return (r + 1) * base(i); });
      Tensor out = zeros_on_device(count);
      pg_.allgather(out, in)->wait();
      bad = mismatches(out, [&](int64_t i) { return (i / chunk + 1) * base(i % chunk); });
    } else {
      Tensor in = pattern(count, o_.dtype, device_, [&](int64_t i) { return (r + 1) + static_cast<double>(i % 3); });
      Tensor out = zeros_on_device(chunk);
      pg_.reduce_scatter(out, in, ReduceOp::Sum)->wait();
      int64_t offset = chunk * r;
      bad = mismatches(out, [&](int64_t i) { return tri + n * static_cast<double>((offset + i) % 3); });
    }
    if (bad > 0) std::fprintf(stderr, "rank %d: %s of %lld bytes: %lld wrong elements\n", r, op.c_str(),
                              static_cast<long long>(row.bytes), static_cast<long long>(bad));
    // Every rank's verdict counts: the row fails if any rank saw a wrong element.
    Tensor flag = pattern(1, DType::Float32, device_, [&](int64_t) { return bad > 0 ? 1.0 : 0.0; });
    pg_.allreduce(flag, ReduceOp::Max)->wait();
    row.ok = flag.to(Device::cpu()).data<float>()[0] == 0.0f;
    return row;
  }

 private:
  Tensor zeros_on_device(int64_t n) {
    return pattern(n, o_.dtype, device_, [](int64_t) { return 0.0; });
  }

  template <class Issue>
  std::vector<double> time_runs(Issue& issue) {
    std::vector<double> us;
#ifdef DPT_HAVE_CUDA
    if (device_.is_cuda()) {
      // Events on the caller's stream, which waits on each collective: GPU-side time of every run.
      std::vector<cuda::CudaEvent> events;
      for (int i = 0; i <= o_.iters; ++i) events.emplace_back(true, device_.index);
      events[0].record();
      for (int i = 0; i < o_.iters; ++i) {
        issue()->wait();
        events[static_cast<size_t>(i) + 1].record();
      }
      events.back().synchronize();
      for (int i = 0; i < o_.iters; ++i)
        us.push_back(1000.0 * events[static_cast<size_t>(i)].elapsed_ms(events[static_cast<size_t>(i) + 1]));
      return us;
    }
#endif
    for (int i = 0; i < o_.iters; ++i) {
      auto start = std::chrono::steady_clock::now();
      issue()->wait();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    return us;
  }

  std::shared_ptr<ProcessGroup> group_;
  ProcessGroup& pg_;
  const Options& o_;
  Device device_;
};

int run_collectives(const Options& options) {
  Options o = options;
  auto env = dist::read_dist_env();
  if (o.backend.empty()) o.backend = cuda::is_available() ? "nccl" : "gloo";
  Device device = Device::cpu();
  if (o.backend == "nccl") {
    DPT_CHECK(cuda::is_available(), "--backend nccl needs a CUDA device; none is available");
    int local_device = env.local_rank % cuda::device_count();
    cuda::set_device(local_device);
    device = Device::cuda(local_device);
  }
  dist::ProcessGroupOptions pg_options;
  pg_options.backend = o.backend;
  pg_options.cuda_device = device.is_cuda() ? device.index : -1;
  auto pg = dist::init_process_group(env, pg_options);
  const bool leader = pg->rank() == 0;

  std::FILE* csv = nullptr;
  if (leader && !o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    DPT_CHECK(csv != nullptr, "cannot write the CSV file '{}'", o.csv);
    std::fprintf(csv, "op,backend,dtype,ranks,bytes,count,time_us,algbw_GBps,busbw_GBps,check\n");
  }
  if (leader) {
    std::printf("# dpt-bench collectives: backend %s, %d ranks, dtype %s, %d warm-up + %d timed runs (median), %s\n",
                o.backend.c_str(), pg->size(), dtype_name(o.dtype), o.warmup, o.iters,
                o.async_op ? "async_op (communication stream)" : "on the caller's stream");
    std::printf("%-15s %14s %12s %12s %10s %10s %7s\n", "op", "size(B)", "count", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "check");
  }
  Bench bench(pg, o, device);
  bool all_ok = true;
  for (const auto& op : o.ops) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step_factor) {
      Row row = bench.run(op, bytes);
      if (row.count == 0) continue;
      all_ok = all_ok && row.ok;
      if (!leader) continue;
      std::printf("%-15s %14lld %12lld %12.2f %10.2f %10.2f %7s\n", row.op.c_str(),
                  static_cast<long long>(row.bytes), static_cast<long long>(row.count), row.time_us, row.algbw,
                  row.busbw, row.ok ? "OK" : "FAILED");
      std::fflush(stdout);
      if (csv)
        std::fprintf(csv, "%s,%s,%s,%d,%lld,%lld,%.3f,%.4f,%.4f,%s\n", row.op.c_str(), o.backend.c_str(),
                     dtype_name(o.dtype), pg->size(), static_cast<long long>(row.bytes),
                     static_cast<long long>(row.count), row.time_us, row.algbw, row.busbw, row.ok ? "OK" : "FAILED");
    }
  }
  if (csv) std::fclose(csv);
  pg->barrier()->wait();
  if (leader && !all_ok) std::fprintf(stderr, "dpt-bench collectives: some results were wrong (rows marked FAILED)\n");
  return all_ok ? 0 : 1;
}

// The collectives --ops may name.
const std::vector<std::string> kOps = {"allreduce", "allgather", "reduce_scatter", "broadcast"};

// A size: a positive number of bytes with an optional K, M or G (KiB, MiB, GiB).
const CLI::Validator kBytes(
    [](std::string& text) {
      try {
        parse_bytes(text);
        return std::string();
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    },
    "SIZE");

SubcommandRun setup_collectives(CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto min_bytes = std::make_shared<std::string>("1K"), max_bytes = std::make_shared<std::string>("1G");
  auto dtype = std::make_shared<std::string>("f32"), async_op = std::make_shared<std::string>("off");
  app.add_option("--backend", o->backend, "nccl or gloo (default: nccl when a GPU is present, else gloo)")
      ->check(CLI::IsMember({"nccl", "gloo"}));
  app.add_option("--ops", o->ops, "collectives to time")
      ->delimiter(',')
      ->check(CLI::IsMember(kOps))
      ->capture_default_str();
  app.add_option("--min-bytes", *min_bytes, "smallest buffer")->check(kBytes)->capture_default_str();
  app.add_option("--max-bytes", *max_bytes, "largest buffer")->check(kBytes)->capture_default_str();
  app.add_option("--step-factor", o->step_factor, "each size is the previous one times this")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--dtype", *dtype, "element type")->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  app.add_option("--warmup", o->warmup, "untimed runs per size")->check(cli::at_least(0))->capture_default_str();
  app.add_option("--iters", o->iters, "timed runs per size (the median is reported)")
      ->check(cli::at_least(1))
      ->capture_default_str();
  app.add_option("--async-op", *async_op, "on: time on the communication stream, as async_op=True")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--csv", o->csv, "also write the rows to this CSV file");
  cli::set_examples(app, {"dpt-run --standalone --nproc-per-node 8 -- dpt-bench collectives --backend nccl",
                          "dpt-run --standalone --nproc-per-node 2 -- dpt-bench collectives --backend gloo "
                          "--ops allreduce --max-bytes 16M --csv gloo.csv"});
  return [o, min_bytes, max_bytes, dtype, async_op] {
    o->min_bytes = parse_bytes(*min_bytes);
    o->max_bytes = parse_bytes(*max_bytes);
    o->dtype = parse_dtype(*dtype);
    o->async_op = *async_op == "on";
    DPT_CHECK(o->min_bytes <= o->max_bytes, "--min-bytes {} is above --max-bytes {}", o->min_bytes, o->max_bytes);
    return run_collectives(*o);
  };
}

}  // namespace

DPT_BENCH_SUBCOMMAND(collectives, "bandwidth and latency of each collective over sizes (like nccl-tests)",
                     setup_collectives);

}  // namespace dpt::bench
