// dpt-bench attention: causal attention as a transformer layer runs it, causal_attention_qkv on a packed
// [B, T, 3C] projection (core/ops_flash_attention.h), timed on its own at one shape (default GPT-2 124M:
// B 16, H 12, T 1024, D 64, bfloat16): the training forward (recording autograd) and the backward, for
// each path asked for (DPT_ATTENTION, core/flags.h: auto = cuDNN where it has an engine, else our
// kernels; flash = our kernels; reference = the composed path). FLOPs count the causal half only:
// forward 2 B H T^2 D (Q K^T and P V over the visible triangle), backward 2.5 times that (dV, dP, dK,
// dQ and the recomputed S: five products where the forward has two), as FlashAttention reports them.
// --check compares the op on each path (forward and gradient, through autograd) with the composed path
// split -> matmul -> causal_softmax -> matmul run in float32 on the same values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/flags.h"
#include "core/ops.h"
#include "core/ops_attention.h"
#include "core/ops_flash_attention.h"
#include "subcommand.h"

namespace dpt::bench {
namespace {

struct Options {
  int64_t batch = 16, heads = 12, seq = 1024, dim = 64;
  DType dtype = DType::BFloat16;
  int warmup = 5;
  int iters = 20;
  std::vector<std::string> paths{"auto", "flash"};
  bool check = false;
  bool cpu = false;
};

void usage() {
  std::printf(
      "usage: dpt-bench attention [--batch 16] [--heads 12] [--seq 1024] [--dim 64] [--dtype bf16|f32]\n"
      "                           [--warmup 5] [--iters 20] [--path auto,flash,reference] [--check] [--cpu]\n"
      "Times the causal attention forward and backward (median of --iters after --warmup runs, CUDA\n"
      "events) on each DPT_ATTENTION path in --path and prints ms and TFLOP/s per phase. --check also\n"
      "compares output and gradient with the composed path in float32 (exit code 1 beyond 2e-2 in\n"
      "bfloat16, 5e-2 on the reference path).\n");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      DPT_CHECK(i + 1 < argc, "dpt-bench attention: {} needs a value", a);
      return argv[++i];
    };
    if (a == "--batch") {
      o.batch = std::stoll(value());
    } else if (a == "--heads") {
      o.heads = std::stoll(value());
    } else if (a == "--seq") {
      o.seq = std::stoll(value());
    } else if (a == "--dim") {
      o.dim = std::stoll(value());
    } else if (a == "--dtype") {
      const std::string d = value();
      DPT_CHECK(d == "bf16" || d == "f32", "dpt-bench attention: --dtype must be bf16 or f32, found '{}'", d);
      o.dtype = d == "bf16" ? DType::BFloat16 : DType::Float32;
    } else if (a == "--warmup") {
      o.warmup = std::stoi(value());
    } else if (a == "--iters") {
      o.iters = std::stoi(value());
    } else if (a == "--path") {
      o.paths = split_commas(value());
      for (const auto& path : o.paths) {
        DPT_CHECK(path == "auto" || path == "flash" || path == "reference",
                  "dpt-bench attention: --path takes auto, flash or reference, found '{}'", path);
      }
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--cpu") {
      o.cpu = true;
    } else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else {
      DPT_FAIL("dpt-bench attention: unknown option '{}' (see --help)", a);
    }
  }
  DPT_CHECK(o.iters > 0 && o.warmup >= 0 && o.batch > 0 && o.heads > 0 && o.seq > 0 && o.dim > 0 && !o.paths.empty(),
            "dpt-bench attention: need positive --batch, --heads, --seq, --dim, --iters, --warmup >= 0 and a --path");
  return o;
}

// max |a - b| / max |b| over all elements.
double max_relative(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    num = std::max(num, std::abs(va[i] - vb[i]));
    den = std::max(den, std::abs(vb[i]));
  }
  return num / den;
}

struct Grads {
  Tensor out, grad;
};

template <class F>
Grads forward_backward(F&& attention, const Tensor& qkv, const Tensor& g) {
  Tensor leaf = qkv.detach().clone().requires_grad_();
  Tensor out = attention(leaf);
  out.backward(g);
  return {out, leaf.grad()};
}

int run_attention_bench(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool gpu = !o.cpu && cuda::is_available();
  const Device device = gpu ? Device::cuda(0) : Device::cpu();
  const TensorOptions opts = TensorOptions{}.with_dtype(o.dtype).with_device(device);
  const int64_t bh = o.batch * o.heads, t = o.seq, d = o.dim, c = o.heads * d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Generator gen(4321);
  Tensor qkv = randn({o.batch, t, 3 * c}, gen, opts).requires_grad_(), g = randn({o.batch, t, c}, gen, opts);

  const double fwd_flop =
      2.0 * static_cast<double>(bh) * static_cast<double>(t) * static_cast<double>(t) * static_cast<double>(d);
  const double bwd_flop = 2.5 * fwd_flop;
  const std::string device_name = gpu ? cuda::device_name(device.index) : "cpu";
  std::printf(
      "dpt-bench attention: B %lld H %lld T %lld D %lld %s on %s, median of %d (causal FLOPs: forward "
      "%.2f GFLOP, backward %.2f GFLOP)\n",
      static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(t),
      static_cast<long long>(d), dtype_name(o.dtype), device_name.c_str(), o.iters, fwd_flop * 1e-9, bwd_flop * 1e-9);

  int status = 0;
  for (const std::string& path : o.paths) {
    ScopedFlag flag(Flag::Attention, path);
    // The forward records autograd, as a training step's does (cuDNN runs only such forwards); the
    // backward is timed as forward + backward less the forward.
    const double fwd_ms =
        median_ms(o.warmup, o.iters, device, [&] { (void)causal_attention_qkv(qkv, o.heads, scale); });
    const double step_ms = median_ms(o.warmup, o.iters, device, [&] {
      qkv.zero_grad(true);  // the gradient is written, not added to the last one
      causal_attention_qkv(qkv, o.heads, scale).backward(g);
    });
    const double bwd_ms = step_ms - fwd_ms;
    std::printf("  %-9s forward %8.3f ms %7.1f TFLOP/s   backward %8.3f ms %7.1f TFLOP/s   total %8.3f ms\n",
                path.c_str(), fwd_ms, fwd_flop / (fwd_ms * 1e9), bwd_ms, bwd_flop / (bwd_ms * 1e9), step_ms);
    std::printf(
        "{\"bench\": \"attention\", \"path\": \"%s\", \"device\": \"%s\", \"b\": %lld, \"h\": %lld, \"t\": "
        "%lld, \"d\": %lld, \"dtype\": \"%s\", \"forward_ms\": %.4f, \"backward_ms\": %.4f, "
        "\"forward_tflops\": %.2f, \"backward_tflops\": %.2f}\n",
        path.c_str(), device_name.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.heads),
        static_cast<long long>(t), static_cast<long long>(d), dtype_name(o.dtype), fwd_ms, bwd_ms,
        fwd_flop / (fwd_ms * 1e9), bwd_flop / (bwd_ms * 1e9));

    if (o.check) {
      auto on_path = [&](const Tensor& x) { return causal_attention_qkv(x, o.heads, scale); };
      auto composed = [&](const Tensor& x) {
        std::vector<Tensor> parts = split(x, {c, c, c}, 2);
        auto heads = [&](const Tensor& p) { return p.reshape({o.batch, t, o.heads, d}).permute({0, 2, 1, 3}); };
        Tensor y =
            matmul(causal_softmax(matmul(heads(parts[0]), heads(parts[1]), false, true), scale), heads(parts[2]));
        return y.permute({0, 2, 1, 3}).reshape({o.batch, t, c});
      };
      auto f32 = [](const Tensor& x) { return x.detach().to(DType::Float32); };
      const Grads got = forward_backward(on_path, qkv, g);
      const Grads want = forward_backward(composed, f32(qkv), f32(g));
      // The composed path in bfloat16 rounds the [T, T] scores and their gradient to bfloat16 in memory.
      const double tol = o.dtype == DType::Float32 ? 1e-4 : path == "reference" ? 5e-2 : 2e-2;
      const double e_out = max_relative(got.out, want.out), e_grad = max_relative(got.grad, want.grad);
      const bool ok = e_out < tol && e_grad < tol;
      std::printf("  %-9s check against the composed path in float32: out %.2e  dqkv %.2e  %s\n", path.c_str(), e_out,
                  e_grad, ok ? "ok" : "FAILED");
      if (!ok) status = 1;
    }
  }
  return status;
}

}  // namespace
}  // namespace dpt::bench

DPT_BENCH_SUBCOMMAND(attention, "causal attention: forward and backward ms and TFLOP/s per DPT_ATTENTION path",
                     [](int argc, char** argv) { return dpt::bench::run_attention_bench(argc, argv); });
