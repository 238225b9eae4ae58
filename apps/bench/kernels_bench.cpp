// dpt-bench kernels: the memory-bound kernels of a GPT-2 training step, timed one at a time at GPT-2
// shapes (LayerNorm forward/backward, the copies behind attention's q/k/v split and head merge, the
// bias-gradient column reduction, the bias add, dtype conversion, fill) and the fused AdamW over the
// ~92M-parameter MLP's parameters (GPU only). Each case prints the median
// time, the bandwidth it reached, and the time the bytes it must move would take at --peak-gbs: the
// memory floor a memory-bound kernel can approach but not beat.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command_line.h"
#include "core/cuda_runtime.h"
#ifdef DPT_HAVE_CUDA
#include "core/cuda/gemm_lt.h"
#endif
#include "core/error.h"
#include "core/factory.h"
#include "core/kernel_dispatch.h"
#include "core/kernels.h"
#include "core/norm_kernels.h"
#include "core/op_helpers.h"
#include "core/ops.h"
#include "optim/adam.h"
#include "subcommand.h"


namespace dpt::bench {
namespace {

struct Options {
  int64_t batch = 16, seq = 1024, embd = 768, heads = 12;
  DType dtype = DType::BFloat16;
  int warmup = 5;
  int iters = 50;
  double peak_gbs = 3350;  // H100 SXM HBM3
  std::string only;        // run the cases whose name contains this
  bool cpu = false;
};

// The options each case reads, checked together (each alone was checked while parsing).
void check_options(const Options& o) {
  DPT_CHECK(o.embd % o.heads == 0, "dpt-bench kernels: --embd {} is not a multiple of --heads {}", o.embd, o.heads);
}

// "[a, b]" after `prefix`.
std::string dims(int64_t a, int64_t b, const char* prefix) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s[%lld, %lld]", prefix, static_cast<long long>(a), static_cast<long long>(b));
  return buf;
}

struct Case {
  std::string name;
  std::string shape;
  double bytes;  // the least a kernel must read plus write
  std::function<void()> run;
};

int run_kernels_bench(const Options& o) {
  check_options(o);
  const bool gpu = !o.cpu && cuda::is_available();
  const Device device = gpu ? Device::cuda(0) : Device::cpu();
  const TensorOptions opts = TensorOptions{}.with_dtype(o.dtype).with_device(device);
  const TensorOptions f32 = opts.with_dtype(DType::Float32);
  const double elt = o.dtype == DType::BFloat16 ? 2.0 : 4.0;
  const int64_t rows = o.batch * o.seq, c = o.embd, h = o.heads, d = o.embd / o.heads;
  const auto nrows = static_cast<double>(rows), nc = static_cast<double>(c);
  Generator gen(1234);

  // Activations [rows, C] and their gradients; LayerNorm parameters in the activation dtype.
  Tensor x = randn({rows, c}, gen, opts), gy = randn({rows, c}, gen, opts), g1 = randn({rows, c}, gen, opts);
  Tensor w = randn({c}, gen, opts), b = randn({c}, gen, opts);
  Tensor y = Tensor::empty({rows, c}, opts), gx = Tensor::empty({rows, c}, opts);
  Tensor gw = Tensor::empty({c}, opts), gb = Tensor::empty({c}, opts);
  Tensor mean = Tensor::empty({rows}, f32), rstd = Tensor::empty({rows}, f32);
  // Wider activations for the MLP / qkv bias gradients and the bias add.
  Tensor g4 = randn({rows, 4 * c}, gen, opts), b4 = randn({4 * c}, gen, opts);
  Tensor out4 = Tensor::empty({rows, 4 * c}, opts), gb4 = Tensor::empty({4 * c}, opts);
  Tensor g3 = randn({rows, 3 * c}, gen, opts), gb3 = Tensor::empty({3 * c}, opts);
  Tensor xf = randn({rows, c}, gen, f32), xb = Tensor::empty({rows, c}, opts);
  Tensor fill_f = Tensor::empty({rows, c}, f32);
  Tensor cat_out;
  Tensor heads_src = randn({o.batch, o.seq, 3 * c}, gen, opts);
  Tensor heads_dst = Tensor::empty({o.batch, h, o.seq, d}, opts);
  Tensor gq = randn({o.batch, o.seq, c}, gen, opts), gk = randn({o.batch, o.seq, c}, gen, opts),
         gv = randn({o.batch, o.seq, c}, gen, opts);
  Tensor tr_dst = Tensor::empty({c, rows}, opts);

  std::vector<Case> cases;
  const std::string rc = dims(rows, c, ""), rc3 = dims(rows, 3 * c, ""), rc4 = dims(rows, 4 * c, "");
  cases.push_back({"layer_norm forward", rc, 2 * nrows * nc * elt + 8 * nrows,
                   [&] { DPT_KERNEL_DISPATCH(device, layer_norm_forward, x, w, b, y, mean, rstd, rows, c, 1e-5); }});
  cases.push_back({"layer_norm backward", rc, 3 * nrows * nc * elt + 8 * nrows, [&] {
                     DPT_KERNEL_DISPATCH(device, layer_norm_backward, gy, x, w, mean, rstd, gx, gw, gb, rows, c, Tensor());
                   }});
  // The transformer block's form: the skip connection's gradient added into dx before rounding.
  cases.push_back({"layer_norm backward + skip grad", rc, 4 * nrows * nc * elt + 8 * nrows, [&] {
                     DPT_KERNEL_DISPATCH(device, layer_norm_backward, gy, x, w, mean, rstd, gx, gw, gb, rows, c, g1);
                   }});
  // split(qkv)'s backward: three [B, T, C] gradients concatenated along the last dim.
  cases.push_back({"concat q/k/v grads (split backward)", dims(rows, c, "3 x "), 6 * nrows * nc * elt, [&] {
                     cat_out = detail::concat_data({gq, gk, gv}, 2);
                   }});
  // q of the fused qkv output to [B, H, T, D] (attention's head split, made contiguous).
  cases.push_back({"head split copy (q of qkv)", rc, 2 * nrows * nc * elt, [&] {
                     kernels::copy_strided(
                         make_view(heads_src, {o.batch, h, o.seq, d}, {o.seq * 3 * c, d, 3 * c, 1}, 0), heads_dst);
                   }});
  // A plain 2-D transpose: the copy whose source has its unit stride on the outer dim.
  cases.push_back({"transpose copy", dims(c, rows, "^T of "), 2 * nrows * nc * elt,
                   [&] { kernels::copy_strided(x.transpose(0, 1).detach(), tr_dst); }});
  cases.push_back({"bias grad (column sum) C", rc, nrows * nc * elt,
                   [&] { kernels::reduce(kernels::ReduceOp::Sum, gy, 1, rows, c, gb, Tensor()); }});
  cases.push_back({"bias grad (column sum) 3C", rc3, 3 * nrows * nc * elt,
                   [&] { kernels::reduce(kernels::ReduceOp::Sum, g3, 1, rows, 3 * c, gb3, Tensor()); }});
  cases.push_back({"bias grad (column sum) 4C", rc4, 4 * nrows * nc * elt,
                   [&] { kernels::reduce(kernels::ReduceOp::Sum, g4, 1, rows, 4 * c, gb4, Tensor()); }});
  cases.push_back({"bias add 4C", rc4, 8 * nrows * nc * elt,
                   [&] { kernels::binary(kernels::BinaryOp::Add, g4, detail::broadcast_view(b4, g4.shape()), out4); }});
  cases.push_back({"convert f32 -> act dtype", rc, nrows * nc * (4 + elt), [&] { kernels::copy_strided(xf, xb); }});
  cases.push_back({"fill f32", rc, nrows * nc * 4, [&] { kernels::fill(fill_f, 0.0); }});

  // Cross-entropy over GPT-2's logits [B T, 50257], all in place (the logits become their gradient):
  // forward then backward as two passes (3 crossings of the logits), and the fused pass (2 crossings).
  // GPU only, like AdamW below.
  Tensor logits, targets, losses, lse, ce_scale;
  const int64_t vocab = 50257;
  const auto nvocab = static_cast<double>(vocab);
  if (gpu) {
    logits = randn({rows, vocab}, gen, opts);
    targets = randint({rows}, 0, vocab, gen, opts.with_dtype(DType::Int64));
    losses = Tensor::empty({rows}, f32);
    lse = Tensor::empty({rows}, f32);
    ce_scale = full({}, 1.0 / nrows, f32);
    const std::string rv = dims(rows, vocab, "");
    cases.push_back({"cross_entropy forward", rv, nrows * nvocab * elt, [&] {
                       kernels::cross_entropy(logits, targets, -100, losses, lse);
                     }});
    cases.push_back({"cross_entropy backward (in place)", rv, 2 * nrows * nvocab * elt, [&] {
                       kernels::cross_entropy_backward(logits, targets, -100, lse, ce_scale, logits);
                     }});
    cases.push_back({"cross_entropy fused fwd+bwd (in place)", rv, 2 * nrows * nvocab * elt, [&] {
                       kernels::cross_entropy_with_grad(logits, targets, -100, ce_scale, losses, lse, logits);
                     }});
  }

#ifdef DPT_HAVE_CUDA
  // The MLP's GELU backward with its bias gradient (bf16 only): reads the output gradient and the saved
  // pre-activation, writes the pre-activation gradient; the bias's column sums ride along.
  Tensor saved4, gpre4;
  if (gpu && o.dtype == DType::BFloat16) {
    saved4 = randn({rows, 4 * c}, gen, opts);
    gpre4 = Tensor::empty({rows, 4 * c}, opts);
    cases.push_back({"gelu backward + bias grad 4C", rc4, 3 * nrows * 4 * nc * elt, [&] {
                       DPT_CHECK(cuda_kernels::activation_backward_bias(g4, saved4, gpre4, gb4,
                                                                        cuda_kernels::LtActivation::Gelu),
                                 "dpt-bench kernels: the fused GELU backward declined its operands");
                     }});
  }
#endif

  // AdamW with bf16 compute twins over the MLP workload's parameter shapes (92.2M): per parameter it
  // reads and writes the float32 master, exp_avg and exp_avg_sq (24 B), reads the bf16 gradient (2 B)
  // and writes the bf16 twin (2 B). GPU only: the CPU loops would take minutes at this size.
  NamedTensors masters, twins;
  std::unique_ptr<optim::AdamW> adamw;
  if (gpu) {
    const std::vector<int64_t> widths = {1024, 4096, 4096, 4096, 4096, 4096, 4096, 1000};
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
      for (Shape shape : {Shape{widths[l + 1], widths[l]}, Shape{widths[l + 1]}}) {
        std::string name = std::to_string(l);
        name += shape.size() == 2 ? ".weight" : ".bias";
        Tensor m = randn(shape, gen, f32);
        m.requires_grad_(true);
        Tensor t = m.detach().to(DType::BFloat16);
        t.requires_grad_(true);
        t.set_grad(randn(shape, gen, f32).to(DType::BFloat16));
        masters.emplace_back(name, m);
        twins.emplace_back(name, t);
      }
    }
    adamw = std::make_unique<optim::AdamW>(optim::weight_decay_groups(masters, 0.1), optim::AdamOptions{});
    adamw->set_compute_twins(twins);
    double n = 0;
    for (const auto& entry : masters) n += static_cast<double>(entry.second.numel());
    char shape[48];
    std::snprintf(shape, sizeof(shape), "%.1fM params", n / 1e6);
    cases.push_back({"adamw, bf16 twins (MLP 92M)", shape, 28 * n, [&] { adamw->step(); }});
  }

  std::printf("dpt-bench kernels on %s, %s, B=%lld T=%lld C=%lld H=%lld, median of %d (floor at %.0f GB/s)\n",
              gpu ? cuda::device_name(0).c_str() : "CPU", dtype_name(o.dtype), static_cast<long long>(o.batch),
              static_cast<long long>(o.seq), static_cast<long long>(c), static_cast<long long>(h), o.iters, o.peak_gbs);
  std::printf("%-38s %-22s %10s %9s %10s %7s\n", "kernel", "shape", "us", "GB/s", "floor us", "x floor");
  for (const Case& k : cases) {
    if (!o.only.empty() && k.name.find(o.only) == std::string::npos) continue;
    const double us = 1000.0 * median_ms(o.warmup, o.iters, device, k.run);
    const double floor_us = k.bytes / (o.peak_gbs * 1e3);
    std::printf("%-38s %-22s %10.1f %9.0f %10.1f %7.2f\n", k.name.c_str(), k.shape.c_str(), us, k.bytes / (us * 1e3),
                floor_us, us / floor_us);
  }
  return 0;
}

SubcommandRun setup_kernels_bench(CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto dtype = std::make_shared<std::string>("bf16");
  app.add_option("--batch", o->batch, "sequences")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--seq", o->seq, "tokens per sequence")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--embd", o->embd, "embedding width")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--heads", o->heads, "attention heads")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--dtype", *dtype, "element type")->check(CLI::IsMember({"bf16", "f32"}))->capture_default_str();
  app.add_option("--warmup", o->warmup, "untimed runs per case")->check(cli::at_least(0))->capture_default_str();
  app.add_option("--iters", o->iters, "timed runs per case (the median is reported)")
      ->check(cli::at_least(1))
      ->capture_default_str();
  app.add_option("--peak-gbs", o->peak_gbs, "the device's memory bandwidth (GB/s) for the memory floor")
      ->check(cli::number_in(1e-3, 1e9))
      ->capture_default_str();
  app.add_option("--only", o->only, "run the cases whose name contains this");
  app.add_flag("--cpu", o->cpu, "run on the CPU even when there is a GPU");
  cli::set_examples(app, {"dpt-bench kernels", "dpt-bench kernels --only layer_norm --dtype f32",
                          "dpt-bench kernels --cpu --batch 2 --seq 64 --iters 5"});
  return [o, dtype] {
    o->dtype = *dtype == "bf16" ? DType::BFloat16 : DType::Float32;
    return run_kernels_bench(*o);
  };
}

}  // namespace

DPT_BENCH_SUBCOMMAND(kernels, "memory-bound kernels of a GPT-2 step at GPT-2 shapes: us, GB/s, memory floor",
                     setup_kernels_bench);

}  // namespace dpt::bench
