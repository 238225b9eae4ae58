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
// the two event hops an overlapped collective pays (distributed/process_group.h). algbw = S / t; busbw = algbw × factor, with the nccl-tests factors:
// allreduce 2(n−1)/n, allgather and reduce-scatter (n−1)/n, broadcast 1.
//
// Correctness: after timing, each (op, size) runs once more on inputs whose exact result is small
// integers, so it does not depend on the order of summation, and every element is compared exactly
// on every rank. A wrong result marks the row FAILED and makes the exit status non-zero.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/bfloat16.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/tensor.h"
#include "distributed/process_group.h"
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

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "dpt-bench collectives [--backend nccl|gloo] [--ops allreduce,allgather,reduce_scatter,broadcast]\n"
          "    [--min-bytes 1K] [--max-bytes 1G] [--step-factor 2|4] [--dtype f32|bf16] [--warmup 5]\n"
          "    [--iters 20] [--async-op on|off] [--csv FILE]        (run under dpt-run)\n");
      std::exit(0);
    }
    DPT_CHECK(i + 1 < argc, "option {} needs a value", arg);
    std::string v = argv[++i];
    if (arg == "--backend") {
      DPT_CHECK(v == "nccl" || v == "gloo", "--backend must be nccl or gloo, found '{}'", v);
      o.backend = v;
    } else if (arg == "--ops") {
      o.ops = split_commas(v);
      for (const auto& op : o.ops)
        DPT_CHECK(op == "allreduce" || op == "allgather" || op == "reduce_scatter" || op == "broadcast",
                  "--ops: unknown collective '{}' (allreduce, allgather, reduce_scatter, broadcast)", op);
    } else if (arg == "--min-bytes") {
      o.min_bytes = parse_bytes(v);
    } else if (arg == "--max-bytes") {
      o.max_bytes = parse_bytes(v);
    } else if (arg == "--step-factor") {
      o.step_factor = std::stoll(v);
      DPT_CHECK(o.step_factor >= 2, "--step-factor must be >= 2, found {}", o.step_factor);
    } else if (arg == "--dtype") {
      o.dtype = parse_dtype(v);
      DPT_CHECK(o.dtype == DType::Float32 || o.dtype == DType::BFloat16, "--dtype must be f32 or bf16, found '{}'", v);
    } else if (arg == "--warmup") {
      o.warmup = std::stoi(v);
    } else if (arg == "--iters") {
      o.iters = std::stoi(v);
      DPT_CHECK(o.iters >= 1, "--iters must be >= 1");
    } else if (arg == "--async-op") {
      DPT_CHECK(v == "on" || v == "off", "--async-op must be on or off, found '{}'", v);
      o.async_op = v == "on";
    } else if (arg == "--csv") {
      o.csv = v;
    } else {
      DPT_FAIL("unknown option {}", arg);
    }
  }
  DPT_CHECK(o.min_bytes <= o.max_bytes, "--min-bytes {} is above --max-bytes {}", o.min_bytes, o.max_bytes);
  return o;
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

int run_collectives(int argc, char** argv) {
  Options o = parse(argc, argv);
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

}  // namespace

DPT_BENCH_SUBCOMMAND(collectives, "bandwidth and latency of each collective over sizes (like nccl-tests)",
                     run_collectives);

}  // namespace dpt::bench
