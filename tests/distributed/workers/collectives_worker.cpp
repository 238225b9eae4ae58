// Worker for the multi-process distributed tests, started by dpt-run:
//   dpt_test_collectives_worker SCENARIO
// Each scenario checks results against closed forms and prints one summary line per rank; the test
// (tests/distributed/process_group_test.cpp) reads the exit code and those lines.
//
// Inputs are small integers, so every sum, average, maximum and minimum is exact in every dtype
// (bfloat16 included) whatever order the backend reduces in: results are compared exactly.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "collectives/process_group.h"
#include "core/bfloat16.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/float16.h"
#include "core/tensor.h"

using namespace dpt;
using namespace dpt::dist;
using namespace std::chrono_literals;

namespace {

int g_checks = 0;
Device g_device = Device::cpu();  // cuda:LOCAL_RANK for the nccl_* scenarios

// A tensor on the scenario's device holding `values` (built on the host, then copied).
Tensor make(const std::vector<double>& values, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, TensorOptions{}.with_dtype(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    double v = values[i];
    switch (dtype) {
      case DType::Float32: t.data<float>()[i] = static_cast<float>(v); break;
      case DType::Float64: t.data<double>()[i] = v; break;
      case DType::BFloat16: t.data<bf16>()[i] = bf16(static_cast<float>(v)); break;
      case DType::Float16: t.data<f16>()[i] = f16(static_cast<float>(v)); break;
      case DType::Int32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::Int64: t.data<int64_t>()[i] = static_cast<int64_t>(v); break;
    }
  }
  return t.to(g_device);
}

Tensor empty_on_device(int64_t n, DType dtype) {
  return Tensor::empty({n}, TensorOptions{}.with_dtype(dtype).with_device(g_device));
}

double value_at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::Float32: return t.data<float>()[i];
    case DType::Float64: return t.data<double>()[i];
    case DType::BFloat16: return static_cast<float>(t.data<bf16>()[i]);
    case DType::Float16: return static_cast<float>(t.data<f16>()[i]);
    case DType::Int32: return t.data<int32_t>()[i];
    case DType::Int64: return static_cast<double>(t.data<int64_t>()[i]);
  }
  return 0;
}

void expect_equal(const Tensor& device_tensor, const std::vector<double>& expected, const std::string& what) {
  Tensor t = device_tensor.to(Device::cpu());  // ordered after the collective on the current stream
  DPT_CHECK(t.numel() == static_cast<int64_t>(expected.size()), "{}: {} elements, expected {}", what, t.numel(),
            expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    double got = value_at(t, static_cast<int64_t>(i));
    DPT_CHECK(got == expected[i], "{} ({}): element {} is {}, expected {}", what, dtype_name(t.dtype()), i, got,
              expected[i]);
  }
  ++g_checks;
}

// Rank r contributes (r + 1) * (i % 7 + 1) at index i.
std::vector<double> rank_input(int r, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (r + 1) * (i % 7 + 1);
  return v;
}

// async_op = false: on CUDA the collective runs on the caller's stream (process_group.h). Same closed
// forms; and an asynchronous broadcast followed at once by a synchronous sum must still run in issue
// order (the sum then sees root 1's values everywhere: 2 * base * world; the reverse order would give
// root 1's partial sum base * (1 + ... + world)).
void check_synchronous(ProcessGroup& pg) {
  const int w = pg.size(), r = pg.rank();
  const double tri = w * (w + 1) / 2.0;
  const int64_t n = 1001;
  auto finish = [](const std::shared_ptr<Work>& work) {
    if (g_device.is_cpu()) {
      work->wait();
    } else {
      work->synchronize();
    }
  };
  auto times = [&](const std::vector<double>& v, double f) {
    std::vector<double> out = v;
    for (auto& x : out) x *= f;
    return out;
  };
  Tensor t = make(rank_input(r, n), DType::Float32);
  finish(pg.allreduce(t, ReduceOp::Sum, false));
  expect_equal(t, times(rank_input(0, n), tri), "synchronous allreduce");
  Tensor b = make(rank_input(r, n), DType::Float32);
  finish(pg.broadcast(b, w - 1, false));
  expect_equal(b, rank_input(w - 1, n), "synchronous broadcast");
  Tensor gathered = empty_on_device(n * w, DType::Float32);
  finish(pg.allgather(gathered, make(rank_input(r, n), DType::Float32), false));
  std::vector<double> e;
  for (int q = 0; q < w; ++q) {
    auto part = rank_input(q, n);
    e.insert(e.end(), part.begin(), part.end());
  }
  expect_equal(gathered, e, "synchronous allgather");
  Tensor scattered = empty_on_device(n, DType::Float32);
  finish(pg.reduce_scatter(scattered, make(e, DType::Float32), ReduceOp::Sum, false));
  expect_equal(scattered, times(rank_input(r, n), w), "synchronous reduce_scatter");
  if (w > 1) {
    Tensor m = make(rank_input(r, n), DType::Float32);
    pg.broadcast(m, 1);  // asynchronous, not waited for
    finish(pg.allreduce(m, ReduceOp::Sum, false));
    expect_equal(m, times(rank_input(1, n), w), "asynchronous broadcast then synchronous allreduce, in order");
  }
}

void check_collectives(ProcessGroup& pg) {
  const int w = pg.size(), r = pg.rank();
  const double tri = w * (w + 1) / 2.0;  // sum over ranks of (r + 1)
  for (DType dtype : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
      std::string tag = fmt::format("n={} world={}", n, w);
      auto expect = [&](auto f) {
        std::vector<double> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = f(static_cast<double>(i % 7 + 1));
        return v;
      };
      // All four reductions issued before waiting on any: calls are asynchronous and complete in order.
      std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
      if (is_floating(dtype)) ops.push_back(ReduceOp::Avg);
      std::vector<Tensor> tensors;
      std::vector<std::shared_ptr<Work>> works;
      for (auto op : ops) {
        tensors.push_back(make(rank_input(r, n), dtype));
        works.push_back(pg.allreduce(tensors.back(), op));
      }
      for (size_t k = 0; k < ops.size(); ++k) {
        // CPU: wait() blocks the host. CUDA: wait() only orders the current stream; synchronize() blocks.
        if (g_device.is_cpu()) {
          works[k]->wait();
        } else {
          works[k]->synchronize();
        }
        DPT_CHECK(works[k]->is_completed(), "is_completed() false after the host waited");
        std::vector<double> e;
        switch (ops[k]) {
          case ReduceOp::Sum: e = expect([&](double b) { return b * tri; }); break;
          case ReduceOp::Max: e = expect([&](double b) { return b * w; }); break;
          case ReduceOp::Min: e = expect([&](double b) { return b; }); break;
          case ReduceOp::Avg: e = expect([&](double b) { return b * tri / w; }); break;
        }
        expect_equal(tensors[k], e, fmt::format("allreduce {} {}", reduce_op_name(ops[k]), tag));
      }
      for (int root = 0; root < w; ++root) {
        Tensor t = make(rank_input(r, n), dtype);
        pg.broadcast(t, root)->wait();
        expect_equal(t, rank_input(root, n), fmt::format("broadcast root {} {}", root, tag));
      }
      {
        Tensor in = make(rank_input(r, n), dtype);
        Tensor out = empty_on_device(n * w, dtype);
        pg.allgather(out, in)->wait();
        std::vector<double> e;
        for (int q = 0; q < w; ++q) {
          auto part = rank_input(q, n);
          e.insert(e.end(), part.begin(), part.end());
        }
        expect_equal(out, e, "allgather " + tag);
      }
      for (auto op : ops) {
        // Rank q's block b, element i: (q + 1) * (b + 1) + i % 5.
        std::vector<double> in_values;
        for (int b = 0; b < w; ++b)
          for (int64_t i = 0; i < n; ++i) in_values.push_back((r + 1) * (b + 1) + static_cast<double>(i % 5));
        Tensor in = make(in_values, dtype);
        Tensor out = empty_on_device(n, dtype);
        pg.reduce_scatter(out, in, op)->wait();
        std::vector<double> e(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          double c = static_cast<double>(i % 5), b = r + 1;
          double v = 0;
          switch (op) {
            case ReduceOp::Sum: v = b * tri + w * c; break;
            case ReduceOp::Avg: v = (b * tri + w * c) / w; break;
            case ReduceOp::Max: v = w * b + c; break;
            case ReduceOp::Min: v = b + c; break;
          }
          e[static_cast<size_t>(i)] = v;
        }
        // The input must come back unchanged.
        expect_equal(out, e, fmt::format("reduce_scatter {} {}", reduce_op_name(op), tag));
        expect_equal(in, in_values, "reduce_scatter input untouched " + tag);
      }
      if (w > 1) {
        // A ring: send to the next rank, receive from the previous one; both posted before either wait.
        // Odd ranks receive first: on NCCL a send and a recv issued separately run one after the other on
        // the communication stream, so every rank sending first would deadlock (as blocking MPI would).
        Tensor out = make(rank_input(r, n), dtype);
        Tensor in = empty_on_device(n, dtype);
        std::shared_ptr<Work> s, q;
        if (r % 2 == 0) {
          s = pg.send(out, (r + 1) % w, 3);
          q = pg.recv(in, (r + w - 1) % w, 3);
        } else {
          q = pg.recv(in, (r + w - 1) % w, 3);
          s = pg.send(out, (r + 1) % w, 3);
        }
        s->wait();
        q->wait();
        expect_equal(in, rank_input((r + w - 1) % w, n), "send/recv ring " + tag);
      }
    }
  }
  // Coalesced: mixed sizes and dtypes in one call.
  {
    std::vector<Tensor> ts = {make(rank_input(r, 5), DType::Float32), make(rank_input(r, 3), DType::Float64),
                              make(rank_input(r, 1000), DType::Float32), make(rank_input(r, 2), DType::Int32),
                              make(rank_input(r, 9), DType::BFloat16)};
    pg.allreduce_coalesced(ts, ReduceOp::Sum)->wait();
    for (const auto& t : ts) {
      std::vector<double> e = rank_input(0, t.numel());
      for (auto& v : e) v *= tri;
      expect_equal(t, e, fmt::format("allreduce_coalesced {} x {}", t.numel(), dtype_name(t.dtype())));
    }
    std::vector<Tensor> avg = {make(rank_input(r, 4), DType::Float32), make(rank_input(r, 6), DType::Float32)};
    pg.allreduce_coalesced(avg, ReduceOp::Avg)->wait();
    for (const auto& t : avg) {
      std::vector<double> e = rank_input(0, t.numel());
      for (auto& v : e) v *= tri / w;
      expect_equal(t, e, "allreduce_coalesced avg");
    }
  }
  check_synchronous(pg);
  pg.barrier()->wait();
  ++g_checks;
}

// A group with copy_engines moving symmetric tensors (NCCL: the zero-CTA policy, so copy engines where NCCL
// can use them): all-to-all and in-place all-gather give their closed forms. Gloo has no all-to-all and says
// so; its symmetric tensors are plain zeros.
void check_copy_engine_group(ProcessGroup& pg) {
  const int w = pg.size(), r = pg.rank();
  const int64_t n = 1000;
  ProcessGroupOptions options = pg.options();
  options.copy_engines = true;
  auto ce = pg.duplicate(options);
  const TensorOptions f32 = TensorOptions{}.with_dtype(DType::Float32).with_device(g_device);
  Tensor in = ce->symmetric_zeros(n * w, f32);
  Tensor out = ce->symmetric_zeros(n * w, f32);
  expect_equal(out, std::vector<double>(static_cast<size_t>(n * w), 0.0), "symmetric_zeros");
  // Rank q's block b, element i: 1000 q + 10 b + i % 7. Rank r receives block r of every rank q.
  auto block_value = [](int q, int b, int64_t i) { return 1000.0 * q + 10.0 * b + static_cast<double>(i % 7); };
  std::vector<double> in_values, expected;
  for (int b = 0; b < w; ++b)
    for (int64_t i = 0; i < n; ++i) {
      in_values.push_back(block_value(r, b, i));
      expected.push_back(block_value(b, r, i));
    }
  in.copy_(make(in_values, DType::Float32));
  if (g_device.is_cpu()) {
    try {
      ce->alltoall(out, in)->wait();
    } catch (const std::exception& e) {
      DPT_CHECK(std::string(e.what()).find("no alltoall (NCCL only)") != std::string::npos, "gloo alltoall: {}",
                e.what());
      ++g_checks;
      return;
    }
    DPT_FAIL("gloo alltoall did not refuse");
  }
  ce->alltoall(out, in)->wait();
  expect_equal(out, expected, "copy-engine alltoall");
  std::vector<double> gathered;
  for (int q = 0; q < w; ++q) {
    auto part = rank_input(q, n);
    gathered.insert(gathered.end(), part.begin(), part.end());
  }
  Tensor mine = out.slice(r * n, (r + 1) * n);
  mine.copy_(make(rank_input(r, n), DType::Float32));
  ce->allgather(out, mine)->wait();
  expect_equal(out, gathered, "copy-engine allgather in place");
}

// NCCL: a finished operation's tensors are released by the thread that issues the next operation, never
// by the watchdog's thread, whose free could run beside a CUDA graph this thread is capturing.
void check_finished_tensors_wait_for_the_next_operation(ProcessGroup& pg) {
  if (g_device.is_cpu()) return;
  const int device = g_device.index;
  auto settle = [] {
    cuda::synchronize();
    std::this_thread::sleep_for(500ms);  // five watchdog periods: completed operations are retired
  };
  Tensor token = make({1.0}, DType::Float32);
  pg.allreduce(token)->wait();
  settle();
  pg.allreduce(token)->wait();  // releases whatever earlier checks left behind
  settle();
  const size_t before = cuda::memory_allocated(device);
  size_t held = 0;
  {
    Tensor dropped = make(std::vector<double>(1 << 18, 1.0), DType::Float32);
    held = cuda::memory_allocated(device);
    pg.allreduce(dropped)->wait();
  }  // only the operation holds `dropped` now
  settle();
  DPT_CHECK(held > before && cuda::memory_allocated(device) == held,
            "a finished allreduce's tensor was released before the next operation ({} -> {} bytes)", held,
            cuda::memory_allocated(device));
  pg.allreduce(token)->wait();
  DPT_CHECK(cuda::memory_allocated(device) == before, "the next operation did not release the finished one's "
            "tensor ({} bytes held, {} before it)", cuda::memory_allocated(device), before);
  ++g_checks;
}

void check_subgroups(ProcessGroup& pg) {
  const int w = pg.size(), r = pg.rank();
  // Even ranks form a group; every rank calls new_group, odd ranks get nullptr.
  std::vector<int> evens;
  for (int q = 0; q < w; q += 2) evens.push_back(q);
  auto sub = pg.new_group(evens);
  if (r % 2 == 1) {
    DPT_CHECK(sub == nullptr, "rank {} is not in the even group but got a group", r);
  } else {
    DPT_CHECK(sub != nullptr && sub->rank() == r / 2 && sub->size() == static_cast<int>(evens.size()),
              "even group: rank {} expected sub-rank {} of {}", r, r / 2, evens.size());
    Tensor t = make({static_cast<double>(r + 1), 1.0}, DType::Float32);
    sub->allreduce(t)->wait();
    double sum = 0;
    for (int q : evens) sum += q + 1;
    expect_equal(t, {sum, static_cast<double>(evens.size())}, "sub-group allreduce");
    Tensor b = make({static_cast<double>(r)}, DType::Int64);
    sub->broadcast(b, static_cast<int>(evens.size()) - 1)->wait();
    expect_equal(b, {static_cast<double>(evens.back())}, "sub-group broadcast");
    sub->barrier()->wait();
  }
  // The parent still works after (and between) sub-group traffic.
  Tensor t = make({1.0}, DType::Float64);
  pg.allreduce(t)->wait();
  expect_equal(t, {static_cast<double>(w)}, "parent allreduce after sub-group");
}

void on_sigterm(int) {
  const char msg[] = "got SIGTERM\n";
  [[maybe_unused]] ssize_t k = ::write(1, msg, sizeof(msg) - 1);
  ::_exit(7);
}

int run(std::string scenario) {
  auto env = read_dist_env();
  if (scenario.rfind("nccl_", 0) == 0) {
    // The same checks on CUDA tensors: the process group picks NCCL by the tensors' device.
    scenario = scenario.substr(5);
    DPT_CHECK(cuda::device_count() > env.local_rank, "rank {} needs cuda:{}, found {} devices", env.rank,
              env.local_rank, cuda::device_count());
    cuda::set_device(env.local_rank);
    g_device = Device::cuda(env.local_rank);
  }
  if (scenario == "signal") {
    std::signal(SIGTERM, on_sigterm);
    std::printf("ready\n");
    std::fflush(stdout);
    while (true) ::pause();
  }
  ProcessGroupOptions options;
  options.timeout = 20s;
  // The store timeout also bounds NCCL communicator setup (ProcessGroup's setup_timeout), which takes longer
  // than 20 s under compute-sanitizer (scripts/gpu-sanitize.sh) and in a full parallel GPU suite. Start-up
  // is not what these scenarios test: the failure scenarios time their failure from after it, and the one
  // that tests the store's own bound (never_joins) sets it below.
  options.store_timeout = 120s;
  if (scenario == "never_joins") {
    if (env.rank == env.world_size - 1) {
      std::this_thread::sleep_for(60s);  // never joins; dpt-run stops it when the others fail
      return 0;
    }
    options.store_timeout = 1500ms;
    auto pg = init_process_group(env, options);
    std::printf("joined without the last rank\n");
    return 1;
  }
  if (scenario == "exit3") {
    auto pg = init_process_group(env, options);
    if (env.rank == 1) return 3;
    std::this_thread::sleep_for(60s);  // dpt-run must stop this worker
    std::printf("survived\n");
    return 0;
  }
  if (scenario == "restart_once") {
    auto pg = init_process_group(env, options);
    if (env.restart_count == 0 && env.rank == 1) return 5;
    if (env.restart_count == 0) std::this_thread::sleep_for(60s);
    Tensor t = make({1.0}, DType::Float32);
    pg->allreduce(t)->wait();
    expect_equal(t, {static_cast<double>(pg->size())}, "allreduce after restart");
    std::printf("attempt %d OK\n", env.restart_count);
    return 0;
  }
  if (scenario == "peer_exits" || scenario == "peer_stalls") {
    // Rank 1 takes part in one collective, then leaves (exits cleanly) or stalls; the others must get an
    // error naming the operation within the timeout instead of hanging.
    options.timeout = 1500ms;
    auto pg = init_process_group(env, options);
    Tensor t = make({1.0}, DType::Float32);
    pg->allreduce(t)->synchronize();
    if (env.rank == 1) {
      if (scenario == "peer_stalls") pg->store()->get("release");  // waits until the others have failed
      std::printf("peer left\n");
      std::fflush(stdout);
      ::_exit(0);
    }
    const auto failing_since = std::chrono::steady_clock::now();
    try {
      pg->allreduce(t)->synchronize();  // host wait: on CUDA, wait() alone only orders streams
    } catch (const std::exception& e) {
      std::printf("expected error: %s\n", e.what());
      // How long the failure took to surface, apart from process and communicator start-up, which a
      // loaded machine stretches: what the tests bound.
      std::printf("failed after %.3f s\n",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - failing_since).count());
      std::fflush(stdout);
      if (scenario == "peer_stalls" && env.rank == 0) pg->store()->set("release", "1");
      bool names_op = std::strstr(e.what(), "allreduce #2") != nullptr;
      bool names_timeout = std::strstr(e.what(), "timeout 1500 ms") != nullptr;
      if (scenario == "peer_stalls") std::this_thread::sleep_for(500ms);  // let rank 1 read "release"
      return names_op && names_timeout ? 0 : 1;
    }
    std::printf("no error although rank 1 is gone\n");
    return 1;
  }
  if (scenario == "debug_mismatch") {
    options.debug_collectives = true;
    auto pg = init_process_group(env, options);
    Tensor t = make(rank_input(0, 8), DType::Float32);
    pg->allreduce(t)->wait();  // #1 agrees
    try {
      if (env.rank == 1) {
        pg->broadcast(t, 0)->wait();
      } else {
        pg->allreduce(t)->wait();
      }
    } catch (const std::exception& e) {
      std::printf("expected error: %s\n", e.what());
      return 0;
    }
    std::printf("no mismatch reported\n");
    return 1;
  }
  auto pg = init_process_group(env, options);
  if (scenario == "collectives") {
    check_collectives(*pg);
    check_subgroups(*pg);
    check_copy_engine_group(*pg);
    check_finished_tensors_wait_for_the_next_operation(*pg);
    std::printf("collectives OK on rank %d of %d (%d checks)\n", pg->rank(), pg->size(), g_checks);
    return 0;
  }
  std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
}
