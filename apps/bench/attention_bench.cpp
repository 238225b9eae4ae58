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
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command_line.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/flags.h"
#include "core/ops.h"
#include "core/ops_attention.h"
#include "core/ops_flash_attention.h"
#include "json_line.h"
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

int run_attention_bench(const Options& o) {
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
    const nlohmann::ordered_json result = {{"bench", "attention"},
                                           {"path", path},
                                           {"device", device_name},
                                           {"b", o.batch},
                                           {"h", o.heads},
                                           {"t", t},
                                           {"d", d},
                                           {"dtype", dtype_name(o.dtype)},
                                           {"forward_ms", fwd_ms},
                                           {"backward_ms", bwd_ms},
                                           {"forward_tflops", fwd_flop / (fwd_ms * 1e9)},
                                           {"backward_tflops", bwd_flop / (bwd_ms * 1e9)}};
    std::printf("%s\n", json_line(result).c_str());

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

SubcommandRun setup_attention_bench(CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto dtype = std::make_shared<std::string>("bf16");
  app.add_option("--batch", o->batch, "sequences")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--heads", o->heads, "attention heads")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--seq", o->seq, "tokens per sequence")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--dim", o->dim, "head size")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--dtype", *dtype, "element type")->check(CLI::IsMember({"bf16", "f32"}))->capture_default_str();
  app.add_option("--warmup", o->warmup, "untimed runs")->check(cli::at_least(0))->capture_default_str();
  app.add_option("--iters", o->iters, "timed runs (the median is reported)")
      ->check(cli::at_least(1))
      ->capture_default_str();
  app.add_option("--path", o->paths, "DPT_ATTENTION paths to time")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "flash", "reference"}))
      ->capture_default_str();
  app.add_flag("--check", o->check,
               "compare output and gradient with the composed path in float32 (exit 1 beyond 2e-2 in "
               "bfloat16, 5e-2 on the reference path)");
  app.add_flag("--cpu", o->cpu, "run on the CPU even when there is a GPU");
  cli::set_examples(app, {"dpt-bench attention", "dpt-bench attention --path flash --seq 2048 --check",
                          "dpt-bench attention --dtype f32 --dim 128 --path reference"});
  return [o, dtype] {
    o->dtype = *dtype == "bf16" ? DType::BFloat16 : DType::Float32;
    return run_attention_bench(*o);
  };
}

}  // namespace

DPT_BENCH_SUBCOMMAND(attention, "causal attention: forward and backward ms and TFLOP/s per DPT_ATTENTION path",
                     setup_attention_bench);

}  // namespace dpt::bench
