// dpt-bench attention: the fused causal attention kernels (core/ops_flash_attention.h) timed on their
// own at one shape (default GPT-2 124M: B 16, H 12, T 1024, D 64, bfloat16): the forward kernel and
// the whole backward (statistics, dK/dV and dQ kernels), for each implementation asked for
// (DPT_FLASH_IMPL, see core/cuda/flash_attention_mma.cuh). FLOPs count the causal half only:
// forward 2 B H T^2 D (Q K^T and P V over the visible triangle), backward 2.5 times that (dV, dP, dK,
// dQ and the recomputed S: five products where the forward has two), as FlashAttention reports them.
// --check compares the fused op (forward and the three gradients, through autograd) with the composed
// path matmul -> causal_softmax -> matmul run in float32 on the same values.
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
#include "core/flash_attention_kernels.h"
#include "core/kernel_dispatch.h"
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
  std::vector<std::string> impls{"mma", "wmma"};
  bool check = false;
  bool cpu = false;
};

// The options checked together (each alone was checked while parsing).
void check_options(const Options& o) {
  DPT_CHECK(fused_causal_attention_supported(o.dtype, o.dim),
            "dpt-bench attention: no fused kernel for {} with head size {} (32, 64 or 128)", dtype_name(o.dtype),
            o.dim);
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
  Tensor out, gq, gk, gv;
};

template <class F>
Grads forward_backward(F&& attention, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g) {
  Tensor ql = q.detach().clone().requires_grad_(), kl = k.detach().clone().requires_grad_();
  Tensor vl = v.detach().clone().requires_grad_();
  Tensor out = attention(ql, kl, vl);
  out.backward(g);
  return {out, ql.grad(), kl.grad(), vl.grad()};
}

int run_attention_bench(const Options& o) {
  check_options(o);
  const bool gpu = !o.cpu && cuda::is_available();
  const Device device = gpu ? Device::cuda(0) : Device::cpu();
  const TensorOptions opts = TensorOptions{}.with_dtype(o.dtype).with_device(device);
  const int64_t bh = o.batch * o.heads, t = o.seq, d = o.dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Generator gen(4321);
  const Shape shape{o.batch, o.heads, t, d};
  Tensor q = randn(shape, gen, opts), k = randn(shape, gen, opts), v = randn(shape, gen, opts);
  Tensor g = randn(shape, gen, opts);
  Tensor out = Tensor::empty(shape, opts), lse = Tensor::empty({o.batch, o.heads, t}, opts.with_dtype(DType::Float32));
  Tensor gq = Tensor::empty(shape, opts), gk = Tensor::empty(shape, opts), gv = Tensor::empty(shape, opts);

  const double fwd_flop =
      2.0 * static_cast<double>(bh) * static_cast<double>(t) * static_cast<double>(t) * static_cast<double>(d);
  const double bwd_flop = 2.5 * fwd_flop;
  const std::string device_name = gpu ? cuda::device_name(device.index) : "cpu";
  std::printf(
      "dpt-bench attention: B %lld H %lld T %lld D %lld %s on %s, median of %d (causal FLOPs: forward "
      "%.2f GFLOP, backward %.2f GFLOP)\n",
      static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(t),
      static_cast<long long>(d), dtype_name(o.dtype), device_name.c_str(), o.iters, fwd_flop * 1e-9, bwd_flop * 1e-9);

  const char* saved = std::getenv("DPT_FLASH_IMPL");
  const std::string saved_impl = saved != nullptr ? saved : "";
  int status = 0;
  for (const std::string& impl : o.impls) {
    ::setenv("DPT_FLASH_IMPL", impl.c_str(), 1);
    const double fwd_ms = median_ms(o.warmup, o.iters, device, [&] {
      DPT_KERNEL_DISPATCH(device, flash_attention_forward, q, k, v, out, lse, bh, t, d, scale);
    });
    const double bwd_ms = median_ms(o.warmup, o.iters, device, [&] {
      DPT_KERNEL_DISPATCH(device, flash_attention_backward, q, k, v, out, g, lse, gq, gk, gv, bh, t, d, scale);
    });
    std::printf("  %-5s forward %8.3f ms %7.1f TFLOP/s   backward %8.3f ms %7.1f TFLOP/s   total %8.3f ms\n",
                impl.c_str(), fwd_ms, fwd_flop / (fwd_ms * 1e9), bwd_ms, bwd_flop / (bwd_ms * 1e9), fwd_ms + bwd_ms);
    const nlohmann::ordered_json result = {{"bench", "attention"},
                                           {"impl", impl},
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
      auto fused = [&](const Tensor& a, const Tensor& b, const Tensor& c) { return causal_attention(a, b, c, scale); };
      auto composed = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
        return matmul(causal_softmax(matmul(a, b, false, true), scale), c);
      };
      auto f32 = [](const Tensor& x) { return x.to(DType::Float32); };
      const Grads got = forward_backward(fused, q, k, v, g);
      const Grads want = forward_backward(composed, f32(q), f32(k), f32(v), f32(g));
      const double tol = o.dtype == DType::Float32 ? 1e-4 : 2e-2;
      const double e_out = max_relative(got.out, want.out), e_q = max_relative(got.gq, want.gq);
      const double e_k = max_relative(got.gk, want.gk), e_v = max_relative(got.gv, want.gv);
      const bool ok = e_out < tol && e_q < tol && e_k < tol && e_v < tol;
      std::printf("  %-5s check against the composed path in float32: out %.2e  dq %.2e  dk %.2e  dv %.2e  %s\n",
                  impl.c_str(), e_out, e_q, e_k, e_v, ok ? "ok" : "FAILED");
      if (!ok) status = 1;
    }
  }
  if (saved != nullptr) {
    ::setenv("DPT_FLASH_IMPL", saved_impl.c_str(), 1);
  } else {
    ::unsetenv("DPT_FLASH_IMPL");
  }
  return status;
}

SubcommandRun setup_attention_bench(CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto dtype = std::make_shared<std::string>("bf16");
  app.add_option("--batch", o->batch, "sequences")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--heads", o->heads, "attention heads")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--seq", o->seq, "tokens per sequence")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--dim", o->dim, "head size: 32, 64 or 128")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--dtype", *dtype, "element type")->check(CLI::IsMember({"bf16", "f32"}))->capture_default_str();
  app.add_option("--warmup", o->warmup, "untimed runs")->check(cli::at_least(0))->capture_default_str();
  app.add_option("--iters", o->iters, "timed runs (the median is reported)")
      ->check(cli::at_least(1))
      ->capture_default_str();
  app.add_option("--impl", o->impls, "implementations to time")
      ->delimiter(',')
      ->check(CLI::IsMember({"mma", "wmma", "simt"}))
      ->capture_default_str();
  app.add_flag("--check", o->check,
               "compare output and gradients with the composed path in float32 (exit 1 beyond 2e-2)");
  app.add_flag("--cpu", o->cpu, "run on the CPU even when there is a GPU");
  cli::set_examples(app, {"dpt-bench attention", "dpt-bench attention --impl mma --seq 2048 --check",
                          "dpt-bench attention --dtype f32 --dim 128 --impl simt"});
  return [o, dtype] {
    o->dtype = *dtype == "bf16" ? DType::BFloat16 : DType::Float32;
    return run_attention_bench(*o);
  };
}

}  // namespace

DPT_BENCH_SUBCOMMAND(attention,
                     "fused causal attention kernels: forward and backward ms and TFLOP/s per implementation",
                     setup_attention_bench);

}  // namespace dpt::bench
