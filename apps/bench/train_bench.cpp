#include "train_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "command_line.h"
#include "config.h"
#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "distributed/data_parallel.h"
#include "distributed/ddp.h"
#include "distributed/gathered_linear_zero.h"
#include "json_line.h"
#include "layers/flops.h"
#include "layers/gpt.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "optim/adam.h"
#include "optim/mixed_precision.h"
#include "rendezvous/env.h"

namespace dpt::bench {

namespace {

// The model and batch of a workload, read from its dpt-train config (configs/bench_<name>.yaml, or any
// config given with --config): the config is the one definition a workload has, shared with dpt-train and
// bench/pytorch_reference.py. The benchmark's own optimizer (AdamW, below) and random batches replace the
// config's optimizer and data.
struct Workload {
  std::string name;
  bool gpt = true;
  nn::GPTConfig gpt_config;
  std::vector<int64_t> mlp_sizes;
  std::string activation = "relu";
  int64_t batch = 0;
};

Workload workload(const std::string& name, const std::string& config_file) {
  const std::string path = config_file.empty() ? std::string(DPT_CONFIG_DIR) + "/bench_" + name + ".yaml" : config_file;
  DPT_CHECK(config_file.empty() || std::filesystem::exists(path), "dpt-bench train: no config file '{}'", path);
  DPT_CHECK(!config_file.empty() || std::filesystem::exists(path),
            "dpt-bench train: unknown workload '{}' (no {}; the workloads are configs/bench_*.yaml)", name, path);
  train::LoadOptions load;
  load.check_files = false;   // the data is not read: batches are random
  load.check_device = false;  // --device decides
  const train::Config c = train::load_config(path, {}, load);
  Workload w;
  w.name = config_file.empty() ? name : std::filesystem::path(path).stem().string();
  w.batch = c.training.batch_size;
  if (c.model.kind == "gpt") {
    const train::GptConfig& g = c.model.gpt;
    w.gpt_config.vocab_size = g.vocab_size > 0 ? g.vocab_size : c.data.vocab_size;
    w.gpt_config.block_size = g.block_size > 0 ? g.block_size : c.data.seq_len;
    w.gpt_config.n_layer = g.n_layer;
    w.gpt_config.n_head = g.n_head;
    w.gpt_config.n_embd = g.n_embd;
    w.gpt_config.bias = g.bias;
  } else if (c.model.kind == "mlp") {
    w.gpt = false;
    w.mlp_sizes.push_back(c.data.num_features);
    w.mlp_sizes.insert(w.mlp_sizes.end(), c.model.mlp.hidden.begin(), c.model.mlp.hidden.end());
    w.mlp_sizes.push_back(c.data.num_classes);
    w.activation = c.model.mlp.activation;
  } else {
    DPT_FAIL("dpt-bench train: {}: model.kind {} is not benchmarked (gpt or mlp)", path, c.model.kind);
  }
  return w;
}

struct Args {
  std::string workload = "tiny_gpt";
  std::string config;  // instead of --workload: any dpt-train config of a GPT or an MLP
  int steps = 30;
  int warmup = 5;
  std::string precision = "bf16";
  std::string device = "auto";
  double peak_tflops = 0;  // 0: from the device name
  double bucket_cap_mb = 25;
  std::string comm_dtype;             // empty: the gradients' dtype
  bool overlap_optimizer = false;     // with DDP: the optimizer step per bucket inside backward
  bool updates_when_reduced = false;  // with --overlap-optimizer or --zero: UpdateTiming::WhenReduced
  bool unfused_master = false;        // bf16: float32 master gradients and a separate bf16 copy pass
  bool zero = false;                  // with DDP: ZeRO-1, the optimizer sharded across ranks inside backward
  bool gathered_grads = false;        // ZeRO-1 whose Linear gradients come from gathered inputs (MLP only)
  bool copy_engines = false;          // with --zero or --gathered-grads: the collectives on the copy engines (DDPOptions)
  std::string save_start;             // non-empty: write the initial float32 parameters and the batch here (rank 0)
  bool cuda_graph = false;            // capture one step after warm-up and replay it (one launch per step)
  bool held = false;                  // also time steps on a held stream: the GPU time without launch gaps
  bool losses = false;                // print every step's loss, warm-up included, as "losses" in the JSON line
  std::string batches = "repeat";     // repeat: one batch for every step; random: a fresh batch each step
};

// What the options allow together (each on its own was checked while parsing).
void check_combinations(const Args& a) {
  DPT_CHECK(!a.copy_engines || a.zero || a.gathered_grads,
            "dpt-bench train: --copy-engines moves the collectives of --zero or --gathered-grads");
  DPT_CHECK(!(a.zero || a.overlap_optimizer) || (a.precision != "fp16" && !a.unfused_master),
            "dpt-bench train: --zero and --overlap-optimizer update inside backward, from bf16 compute twins or "
            "float32 gradients: not with fp16 (loss scaling) or --unfused-master");
  DPT_CHECK(!a.cuda_graph || a.precision != "fp16",
            "dpt-bench train: --cuda-graph cannot hold fp16's loss "
            "scaling (it reads the overflow flag on the host every step)");
  DPT_CHECK(!a.cuda_graph || a.batches == "repeat",
            "dpt-bench train: --cuda-graph replays the batch it captured: not with --batches random");
  DPT_CHECK(!a.cuda_graph || a.warmup >= 1,
            "dpt-bench train: --cuda-graph needs --warmup 1 or more: the first "
            "step creates library handles and buffers, which a capture cannot");
  DPT_CHECK(!a.zero || a.comm_dtype.empty(),
            "dpt-bench train: --zero communicates in the gradients' dtype "
            "(no --comm-dtype)");
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A copy on the CPU in `dtype`, outside autograd.
Tensor host_copy(const Tensor& t, DType dtype) { return t.detach().to(Device::cpu()).to(dtype); }

struct Batch {
  Tensor x, y;
};

// `count` batches of one rank, drawn in turn from that rank's generator (seed 1 + rank). The draws depend
// on the seed and their order alone, not on the device (core/factory.h: counter-based), so rank 0 can
// draw every other rank's batches for --save-start and get what those ranks train on.
std::vector<Batch> draw_batches(const Workload& w, int rank, int count, DType compute, const TensorOptions& on_device) {
  Generator gen(1 + static_cast<uint64_t>(rank));
  std::vector<Batch> batches;
  for (int i = 0; i < count; ++i) {
    Batch b;
    if (w.gpt) {
      const Shape shape{w.batch, w.gpt_config.block_size};
      b.x = randint(shape, 0, w.gpt_config.vocab_size, gen, on_device.with_dtype(DType::Int32));
      b.y = randint(shape, 0, w.gpt_config.vocab_size, gen, on_device.with_dtype(DType::Int64));
    } else {
      b.x = randn({w.batch, w.mlp_sizes.front()}, gen, on_device.with_dtype(compute));
      b.y = randint({w.batch}, 0, w.mlp_sizes.back(), gen, on_device.with_dtype(DType::Int64));
    }
    batches.push_back(std::move(b));
  }
  return batches;
}

int run_train_bench(const Args& args) {
  check_combinations(args);
  Workload w = workload(args.workload, args.config);
  dist::DistEnv env = dist::read_dist_env();
  Device device = args.device == "auto" ? (cuda::is_available() ? Device::cuda(env.local_rank) : Device::cpu())
                                        : Device::parse(args.device);
  if (device.is_cuda()) cuda::set_device(device.index);
  std::shared_ptr<dist::ProcessGroup> group;
  if (env.world_size > 1) group = dist::init_process_group(env);

  // 1. Model, in float32, on the device.
  Generator gen(0);
  std::shared_ptr<nn::Module> model;
  int64_t n_params = 0;
  if (w.gpt) {
    model = std::make_shared<nn::GPT>(w.gpt_config, gen);
  } else {
    model = std::make_shared<nn::MLP>(w.mlp_sizes, w.activation, gen);
  }
  n_params = model->num_parameters();
  model->to(device);
  DType compute = args.precision == "bf16"   ? DType::BFloat16
                  : args.precision == "fp16" ? DType::Float16
                                             : DType::Float32;

  // 2. Random batches on the device, each rank its own: one for every step (--batches repeat, what the
  // PyTorch reference does by default), or a fresh one for each step, warm-up included (random).
  TensorOptions on_device = TensorOptions{}.with_device(device);
  const int n_batches = args.batches == "random" ? args.warmup + args.steps : 1;
  const std::vector<Batch> batches = draw_batches(w, env.rank, n_batches, compute, on_device);
  const double units_per_step = static_cast<double>(w.gpt ? w.batch * w.gpt_config.block_size : w.batch);

  // 3. --save-start: the starting point, before mixed precision or any step changes it, for
  // bench/pytorch_reference.py --start-file: every parameter in float32 under its dptrain name, and every
  // rank's batches as "__x.RANK.I" (token ids in int64, or MLP inputs in float32: exact for bf16 ones) and
  // "__y.RANK.I" (int64), I counting steps from the first warm-up step; the metadata says how many.
  if (!args.save_start.empty() && env.rank == 0) {
    NamedTensors start;
    for (const auto& [name, p] : model->named_parameters()) start.emplace_back(name, host_copy(p, DType::Float32));
    for (int r = 0; r < env.world_size; ++r) {
      const std::vector<Batch> drawn = r == env.rank ? batches : draw_batches(w, r, n_batches, compute, on_device);
      for (int i = 0; i < n_batches; ++i) {
        start.emplace_back(fmt::format("__x.{}.{}", r, i),
                           host_copy(drawn[i].x, w.gpt ? DType::Int64 : DType::Float32));
        start.emplace_back(fmt::format("__y.{}.{}", r, i), host_copy(drawn[i].y, DType::Int64));
      }
    }
    save_safetensors(
        args.save_start, start,
        {{"workload", w.name}, {"ranks", std::to_string(env.world_size)}, {"batches", std::to_string(n_batches)}});
  }

  // 4. bf16/fp16 compute copies with float32 masters, the optimizer, DDP.
  optim::MixedPrecision mp(model->named_parameters(), compute);
  optim::AdamOptions adam;
  adam.lr = 3e-4;
  adam.beta2 = 0.95;
  optim::AdamW opt(optim::weight_decay_groups(mp.master_params(), 0.1), adam);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::ShardedOptimizer> sharded;  // --zero or --gathered-grads: updated inside backward
  dist::GatheredLinearZero* gathered = nullptr;     // --gathered-grads: it times its own collectives
  if (group) {
    dist::DataParallelOptions dp;
    dp.ddp.bucket_cap_mb = args.bucket_cap_mb;
    dp.ddp.copy_engines = args.copy_engines;
    if (!args.comm_dtype.empty()) dp.ddp.comm_dtype = parse_dtype(args.comm_dtype);
    dp.sharding = args.gathered_grads ? dist::Sharding::GatheredGrads
                  : args.zero         ? dist::Sharding::Zero
                                      : dist::Sharding::None;
    // Gathered gradients always update as each layer's gradients are formed.
    const dist::UpdateTiming in_backward = args.updates_when_reduced || args.gathered_grads
                                               ? dist::UpdateTiming::WhenReduced
                                               : dist::UpdateTiming::AtBackwardEnd;
    dp.timing = args.zero || args.overlap_optimizer ? in_backward : dist::UpdateTiming::OnStep;
    auto make_shard = [&](std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
      auto shard = std::make_unique<optim::AdamW>(std::move(g), adam);
      if (args.cuda_graph) shard->count_steps_on_device();  // replays advance the step on the device
      return shard;
    };
    dist::DataParallel wrapped = dist::wrap_data_parallel(
        model, group, dp, &opt, optim::weight_decay_groups(mp.master_params(), 0.1), make_shard);
    ddp = std::move(wrapped.ddp);
    sharded = std::move(wrapped.sharded);
    gathered = dynamic_cast<dist::GatheredLinearZero*>(sharded.get());
  }
  // bf16: the fused update reads the bf16 gradients and writes the bf16 parameters itself (no float32
  // gradient copies, no separate conversion pass; optim/optimizer.h set_compute_twins). ZeRO sets up
  // the same on its shards.
  const bool twins = compute == DType::BFloat16 && !args.unfused_master;
  if (twins && !sharded) mp.fuse_with(opt);
  const bool optimizer_in_backward = ddp && (args.overlap_optimizer || args.zero);
  // With DDP the graph holds the step's NCCL collectives too (AllReduces, or ZeRO's reduce-scatters and
  // all-gathers).
  DPT_CHECK(!args.cuda_graph || device.is_cuda(), "dpt-bench train: --cuda-graph runs on a GPU (device {})",
            device.str());
  DPT_CHECK(!args.cuda_graph || twins || !mp.enabled(),
            "dpt-bench train: --cuda-graph needs bf16 with fused "
            "master updates or fp32 (not --unfused-master)");
  if (args.cuda_graph) opt.count_steps_on_device();  // replays advance the step on the device

  size_t next_batch = 0;  // steps past the drawn batches (the timing step, --held) start again from the first
  auto step = [&]() {
    const Batch& batch = batches[next_batch++ % batches.size()];
    const Tensor& x = batch.x;
    const Tensor& y = batch.y;
    // The optimizer inside backward reads the gradients backward writes: bf16 twins or float32 ones.
    if (twins || (optimizer_in_backward && !mp.enabled())) {
      model->zero_grad();
      Tensor loss = w.gpt ? static_cast<nn::GPT&>(*model).loss(x, y) : nn::cross_entropy_loss(model->forward(x), y);
      loss.backward();
      if (!optimizer_in_backward) opt.step();
      return loss;
    }
    model->zero_grad();
    if (mp.enabled()) opt.zero_grad();  // float32 masters are separate tensors only under bf16/fp16
    Tensor loss = w.gpt ? static_cast<nn::GPT&>(*model).loss(x, y) : nn::cross_entropy_loss(model->forward(x), y);
    mp.scale_loss(loss).backward();  // fp16: loss * loss scale; the loss itself otherwise
    const bool finite = mp.grads_to_master();
    if (finite) {  // an fp16 overflow skips the update and backs the scale off, as in dpt-train
      opt.step();
      mp.masters_to_model();
    }
    mp.update_scale(!finite);
    return loss;
  };

  // 5. Warm up, then time each step to completion (device synchronised) and take the median. --losses reads
  // each loss after its step's time is taken.
  Tensor loss;
  std::vector<double> losses;
  for (int i = 0; i < args.warmup; ++i) {
    loss = step();
    if (args.losses) losses.push_back(loss.item());
  }
  // --cuda-graph: the next step is captured (the host runs it, the GPU does not) and every timed step
  // replays it; `loss` is then the graph's output, rewritten by each replay.
  std::unique_ptr<cuda::CudaGraph> graph;
  if (args.cuda_graph) {
    graph = std::make_unique<cuda::CudaGraph>();
    graph->capture([&] { loss = step(); });
  }
  auto timed_step = [&] {
    if (graph) {
      graph->replay();
    } else {
      loss = step();
    }
  };
  if (device.is_cuda()) {
    cuda::synchronize();
    cuda::reset_peak_memory_stats(device.index);
  }
  std::vector<double> times;
  for (int i = 0; i < args.steps; ++i) {
    double t0 = now_seconds();
    timed_step();
    if (device.is_cuda()) cuda::synchronize();
    times.push_back(now_seconds() - t0);
    if (args.losses) losses.push_back(loss.item());
  }
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2];
  double flops_per_step = w.gpt ? nn::gpt_flops_per_token(n_params, w.gpt_config.n_layer, w.gpt_config.n_embd,
                                                          w.gpt_config.block_size, w.gpt_config.block_size) *
                                      units_per_step
                                : nn::mlp_flops_per_sample(n_params) * units_per_step;
  std::string device_name = device.is_cuda() ? cuda::device_name(device.index) : "cpu";
  double peak = args.peak_tflops > 0 ? args.peak_tflops : nn::peak_bf16_tflops(device_name.c_str());
  double mfu = flops_per_step / median / (peak * 1e12);
  double peak_bytes = device.is_cuda() ? static_cast<double>(cuda::max_memory_allocated(device.index)) : 0;
  if (graph) {  // the graph keeps its whole memory reserved, in use or not: count all of it
    peak_bytes = std::max(peak_bytes, static_cast<double>(cuda::memory_allocated(device.index) -
                                                          graph->memory_outstanding() + graph->memory_reserved()));
  }
  double peak_gib = peak_bytes / (1 << 30);
  double final_loss = loss.item();

  // --held: the same steps enqueued while the stream waits for the host, then run back to back. The
  // difference from the median above is the time the GPU waited for the host to launch work.
  double held_ms = 0;
  if (args.held && device.is_cuda()) {
    cuda::HeldStreamTimer timer;
    std::vector<double> held;
    for (int i = 0; i < args.steps; ++i) {
      timer.hold();
      timed_step();
      held.push_back(timer.release_ms());
    }
    std::sort(held.begin(), held.end());
    held_ms = held[held.size() / 2];
  }

  // 6. With DDP on CUDA, one more step with per-bucket events: how much communication backward hid.
  // It runs eagerly also after --cuda-graph: the events must be recorded by the host, step by step.
  // --gathered-grads leaves DDP's buckets idle; GatheredLinearZero times its own collectives (exposed:
  // communication still running once backward's compute and the updates have finished).
  double comm_ms = 0, exposed_ms = 0;
  if (gathered && device.is_cuda()) {
    gathered->set_record_timing(true);
    step();
    const dist::GatheredLinearZero::Timing t = gathered->last_timing();
    comm_ms = t.comm_ms;
    exposed_ms = t.exposed_ms;
    gathered->set_record_timing(false);
  } else if (ddp && device.is_cuda()) {
    ddp->set_record_timing(true);
    step();
    auto timings = ddp->last_timings();
    float backward_end = ddp->last_backward_end_ms();
    float busy_until = 0;
    for (const auto& t : timings) {  // the comm stream runs one AllReduce at a time, in bucket order
      float start = std::max(t.launch_ms, busy_until);
      comm_ms += std::max(0.0f, t.end_ms - start);
      busy_until = t.end_ms;
    }
    exposed_ms = std::max(0.0f, busy_until - backward_end);
    ddp->set_record_timing(false);
  }
  if (env.rank == 0) {
    std::printf(
        "dpt-bench train: %s %s%s on %s x%d: %.0f %s per GPU, step %.2f ms, MFU %.1f%%, peak %.2f GiB, "
        "loss %.4f\n",
        w.name.c_str(), graph ? "(CUDA graph) " : "", args.precision.c_str(), device_name.c_str(), env.world_size,
        units_per_step / median, w.gpt ? "tokens/s" : "samples/s", median * 1e3, mfu * 100, peak_gib, final_loss);
    // One JSON line for scripts (scaling, scripts/gpu-*.sh), in the keys' order of bench/pytorch_reference.py's.
    // A non-finite loss is null (JSON has no NaN).
    nlohmann::ordered_json result = {{"system", graph ? "dptrain+graph" : "dptrain"},
                                     {"workload", w.name},
                                     {"precision", args.precision},
                                     {"device", device_name},
                                     {"world", env.world_size},
                                     {"params", n_params},
                                     {"step_ms", median * 1e3},
                                     {"throughput", units_per_step / median},
                                     {"unit", w.gpt ? "tokens/s" : "samples/s"},
                                     {"mfu", mfu},
                                     {"peak_mem_gib", peak_gib},
                                     {"final_loss", final_loss},
                                     {"comm_ms", comm_ms},
                                     {"exposed_comm_ms", exposed_ms},
                                     {"bucket_cap_mb", args.bucket_cap_mb},
                                     {"grad_bytes", n_params * static_cast<int64_t>(dtype_size(compute))}};
    if (held_ms > 0) result["held_step_ms"] = held_ms;
    if (args.losses) result["losses"] = losses;
    std::printf("%s\n", json_line(result).c_str());
    if (held_ms > 0)
      std::printf(
          "dpt-bench train: GPU time of a step with the host ahead %.3f ms: %.3f ms of the step waited for "
          "launches\n",
          held_ms, median * 1e3 - held_ms);
    if (gathered) {
      std::printf(
          "dpt-bench train: Linear gradients formed from all-gathered inputs and output gradients "
          "(GatheredLinearZero)\n");
    } else if (ddp && device.is_cuda()) {
      std::printf("dpt-bench train: gradients averaged by %s\n", ddp->exchange_name().c_str());
    }
    if (ddp && device.is_cuda()) {
      std::printf(
          "dpt-bench train: communication %.3f ms per step, %.3f ms exposed after backward%s (%.1f%% "
          "hidden)%s\n",
          comm_ms, exposed_ms, gathered ? " and the updates" : "",
          comm_ms > 0 ? 100.0 * (1.0 - exposed_ms / comm_ms) : 100.0,
          graph ? " in one eager step (events cannot time a replay's collectives)" : "");
    }
  }
  return 0;
}

}  // namespace

SubcommandRun setup_train_bench(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("--workload", a->workload,
                 "configs/bench_<name>.yaml: gpt2_124m, mlp_92m, tiny_gpt or mlp_small (seconds on a CPU)")
      ->capture_default_str();
  app.add_option("--config", a->config, "any dpt-train config of a GPT or an MLP, instead of --workload")
      ->check(CLI::ExistingFile);
  app.add_option("--steps", a->steps, "timed steps")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--warmup", a->warmup, "untimed steps before them")->check(cli::at_least(0))->capture_default_str();
  app.add_option("--precision", a->precision, "compute precision (float32 masters under bf16 and fp16)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--device", a->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--peak-tflops", a->peak_tflops, "the device's peak for MFU (0: from the device's name)")
      ->check(cli::number_in(0, 1e6));
  app.add_option("--bucket-cap-mb", a->bucket_cap_mb, "DDP's bucket size (MB)")
      ->check(cli::number_in(1e-3, 1e6))
      ->capture_default_str();
  app.add_option("--comm-dtype", a->comm_dtype, "dtype of DDP's communication (default: the gradients')");
  app.add_flag("--overlap-optimizer", a->overlap_optimizer, "with DDP: the optimizer step per bucket inside backward");
  app.add_flag_callback(
      "--updates-when-reduced", [a] { a->updates_when_reduced = a->overlap_optimizer = true; },
      "--overlap-optimizer or --zero, updating on DDP's update stream as each bucket is reduced");
  app.add_flag("--unfused-master", a->unfused_master, "bf16: float32 master gradients and a separate bf16 copy");
  app.add_flag("--zero", a->zero, "with DDP: ZeRO-1, the optimizer sharded across ranks inside backward");
  app.add_flag_callback(
      "--gathered-grads", [a] { a->gathered_grads = a->zero = true; },
      "ZeRO-1 whose Linear gradients come from gathered inputs (MLP only)");
  app.add_flag("--copy-engines", a->copy_engines, "with --zero or --gathered-grads: the collectives on the copy engines");
  app.add_option("--save-start", a->save_start, "write the initial float32 parameters and the batches here (rank 0)");
  app.add_flag("--losses", a->losses, "print every step's loss, warm-up included, as \"losses\" in the JSON line");
  app.add_option("--batches", a->batches, "repeat: one batch for every step; random: a fresh batch each step")
      ->check(CLI::IsMember({"repeat", "random"}))
      ->capture_default_str();
  app.add_flag("--held", a->held, "also time steps on a held stream: the GPU time without launch gaps");
  app.add_flag("--cuda-graph", a->cuda_graph, "capture one step after warm-up and replay it");
  cli::set_examples(app, {"dpt-bench train --workload gpt2_124m --precision bf16 --steps 50",
                          "dpt-run --standalone --nproc-per-node 8 -- dpt-bench train --workload gpt2_124m --zero",
                          "dpt-bench train --workload mlp_small --device cpu --precision fp32 --steps 3 --losses"});
  return [a] { return run_train_bench(*a); };
}

DPT_BENCH_SUBCOMMAND(train, "train a benchmark workload for N steps: tokens/s, step time, MFU, peak memory",
                     setup_train_bench);

}  // namespace dpt::bench
