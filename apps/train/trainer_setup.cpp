// Trainer setup: device and process group, data, model, resume, optimizer, run directory. The order
// matters where noted; everything that can fail on a bad config or checkpoint happens before the run
// directory is touched, so a failed start overwrites nothing.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "checkpointing.h"
#include "components.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "distributed/data_parallel.h"
#include "distributed/gathered_linear_zero.h"
#include "distributed/sampler.h"
#include "hf_gpt2.h"
#include "layers/flops.h"
#include "layers/gpt.h"
#include "memory_estimate.h"
#include "optim/step_outcome.h"
#include "run_settings.h"
#include "stop_signal.h"
#include "trainer.h"

namespace dpt::train {

namespace fs = std::filesystem;

namespace {

// Each rank draws its own dropout masks: the same seed would give every rank the same mask pattern.
// Rank 0 keeps the plain seed, so one process trains exactly like rank 0 of a larger job.
uint64_t dropout_seed(int64_t seed, int rank) {
  return static_cast<uint64_t>(seed) + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull;
}

}  // namespace

Trainer::Trainer(Config config) : config_(std::move(config)), gen_(static_cast<uint64_t>(config_.training.seed)) {}

Trainer::~Trainer() = default;

void Trainer::setup_device() {
  env_ = dist::read_dist_env();
  const std::string& dev = config_.training.device;
  if (dev == "cpu") {
    device_ = Device::cpu();
  } else if (dev == "auto" || dev == "cuda") {
    device_ = (dev == "cuda" || cuda::is_available()) ? Device::cuda(env_.local_rank) : Device::cpu();
  } else {
    device_ = Device::parse(dev);
  }
  if (device_.is_cuda()) {
    const int count = cuda::device_count();
    DPT_CHECK(device_.index < count,
              "training.device: local rank {} would use GPU {} but only {} GPU(s) are visible; start at most {} "
              "processes per node",
              env_.local_rank, device_.index, count, count);
    cuda::set_device(device_.index);
    device_name_ = cuda::device_name(device_.index);
    peak_tflops_ = nn::peak_bf16_tflops(device_name_.c_str());
  }
  DPT_CHECK(config_.training.cuda_graph != "true" || device_.is_cuda(),
            "training.cuda_graph: needs a GPU, and this run trains on {} (training.device {})", device_.str(), dev);
  const std::string& precision = config_.training.precision;
  const bool bf16 = precision == "bf16" || (precision == "auto" && device_.is_cuda());
  compute_ = precision == "fp16" ? DType::Float16 : bf16 ? DType::BFloat16 : DType::Float32;
  if (env_.world_size > 1) {
    dist::ProcessGroupOptions o;
    o.backend = config_.distributed.backend;
    o.timeout = std::chrono::seconds(config_.distributed.timeout_s);
    o.store_timeout = std::chrono::seconds(config_.distributed.timeout_s);
    o.debug_collectives = config_.distributed.debug_checks;
    o.cuda_device = device_.is_cuda() ? device_.index : -1;
    group_ = dist::init_process_group(env_, o);
  }
}

void Trainer::setup_data() {
  data_ = make_data(config_);
  const int rank = env_.rank, world = env_.world_size;
  // DistributedSampler with world 1 is a seeded shuffle: one process with batch N*b visits exactly what N
  // ranks with batch b visit together, step for step.
  dist::DistributedSampler::Options so;
  so.shuffle = config_.data.shuffle;
  so.seed = static_cast<uint64_t>(config_.training.seed);
  auto sampler = std::make_shared<dist::DistributedSampler>(data_.train->size(), rank, world, so);
  data::LoaderOptions lo;
  lo.batch_size = config_.training.batch_size;
  lo.drop_last = true;
  lo.prefetch = static_cast<int>(config_.data.prefetch);
  lo.device = device_;
  DPT_CHECK(config_.training.batch_size <= sampler->size(),
            "training.batch_size {} is larger than the {} examples each of the {} process(es) sees per epoch ({})",
            config_.training.batch_size, sampler->size(), world, data_.train->describe());
  train_loader_ = std::make_unique<data::Loader>(data_.train, sampler, lo);
  const int64_t per_epoch = train_loader_->batches_per_epoch() / config_.training.grad_accum;
  total_steps_ =
      config_.training.steps > 0 ? config_.training.steps : std::max<int64_t>(1, config_.training.epochs * per_epoch);
  if (data_.val) {
    dist::DistributedSampler::Options vo;
    vo.shuffle = false;
    auto vsampler = std::make_shared<dist::DistributedSampler>(data_.val->size(), rank, world, vo);
    data::LoaderOptions vl = lo;
    vl.batch_size = std::min<int64_t>(config_.training.batch_size, vsampler->size());
    vl.prefetch = 0;  // evaluation restarts from its first batch each time
    val_loader_ = std::make_unique<data::Loader>(data_.val, vsampler, vl);
    // Random windows are drawn afresh each (validation) epoch, so eval.batches may span several; a
    // sequential pass has nothing new to show after its first.
    eval_batches_ = config_.data.window == "random" && config_.model.kind == "gpt"
                        ? config_.eval.batches
                        : std::min(config_.eval.batches, val_loader_->batches_per_epoch());
  }
}

void Trainer::setup_model() {
  check_memory_fits(config_, data_.shape, compute_, device_, env_.local_world_size, env_.world_size);
  model_ = std::make_unique<Model>(config_, data_.shape, gen_);
  // Pretrained weights replace the initialization (a resumed checkpoint replaces both, later).
  if (!config_.model.init_from.empty()) {
    const std::string loaded = init_gpt_from(static_cast<nn::GPT&>(*model_->module()), config_.model.init_from);
    if (is_main()) spdlog::info("model.init_from: {}", loaded);
  }
  model_->module()->to(device_);
  gen_.set_state(dropout_seed(config_.training.seed, env_.rank), gen_.offset());
}

void Trainer::resume_or_start() {
  const CheckpointConfig& ck = config_.checkpoint;
  if (!ck.enabled) return;
  // The model about to be trained, in float32 as checkpoints hold it (mixed precision comes later).
  const NamedTensors expected = model_->module()->state_dict();
  std::vector<std::string> skipped, ignored;
  std::optional<optim::Checkpoint> chosen;
  std::string chosen_path;
  if (ck.resume == "auto" || ck.resume == "never") {
    std::optional<FoundCheckpoint> found = find_newest_valid(ck.dir, &skipped, &ignored);
    for (const auto& s : ignored) spdlog::warn("ignoring an entry of checkpoint.dir that is not a checkpoint: {}", s);
    for (const auto& s : skipped) spdlog::warn("skipping a damaged checkpoint: {}", s);
    if (found) {
      const std::string why = incompatibility(found->checkpoint, expected, env_.world_size);
      if (!why.empty()) {
        DPT_FAIL(
            "checkpoint.dir '{}' holds checkpoints of {} (newest: {}). They are left untouched; to train this "
            "config, choose another directory: --set checkpoint.dir=<new dir>",
            ck.dir, why, found->entry.path);
      }
      if (ck.resume == "auto") {
        chosen = std::move(found->checkpoint);
        chosen_path = found->entry.path;
      } else {
        spdlog::info(
            "checkpoint.resume is never: starting over; the checkpoints in {} are set aside (renamed "
            "step_N.set-aside-<pid>), not deleted",
            ck.dir);
      }
    }
  } else {
    optim::Checkpoint loaded = load_run_checkpoint(ck.resume);
    const std::string why = incompatibility(loaded, expected, env_.world_size);
    DPT_CHECK(why.empty(), "cannot resume from '{}' (checkpoint.resume): it is from {}", ck.resume, why);
    chosen = std::move(loaded);
    chosen_path = ck.resume;
  }
  start_step_ = chosen ? chosen->state.step : 0;
  // Every rank must start from the same step, or they would issue different collectives.
  if (group_) {
    const auto s = static_cast<double>(start_step_);
    std::vector<double> sums = sum_over_ranks({s, s * s});
    const double w = env_.world_size;
    DPT_CHECK(sums[1] * w == sums[0] * sums[0],
              "ranks chose different checkpoints to resume from (this rank: step {}); checkpoint.dir '{}' must be on "
              "a filesystem every node sees, or pass checkpoint.resume=<path> present on every node",
              start_step_, ck.dir);
  }
  if (!chosen) return;
  check_settings_unchanged(*chosen, chosen_path);
  if (!chosen->checksummed) {
    spdlog::info("checkpoint {} has no checksums (written before dptrain stored them): its data is loaded unverified",
                 chosen_path);
  }
  // Weights go in now, in float32, before mixed precision snapshots its masters from them.
  model_->module()->load_state_dict(chosen->model);
  resume_path_ = chosen_path;
  resume_from_ = std::move(chosen);
}

void Trainer::check_settings_unchanged(const optim::Checkpoint& checkpoint, const std::string& path) const {
  const auto changes = settings_changes(checkpoint.state.extra, computation_settings(config_, env_.world_size));
  if (!changes) {
    spdlog::warn(
        "checkpoint {} does not record its settings (written before dptrain stored them): resuming without "
        "checking that model, data and optimizer settings match",
        path);
    return;
  }
  if (changes->empty()) return;
  std::string listed;
  for (const auto& change : *changes) listed += "\n  " + change;
  if (config_.checkpoint.resume_changed == "allow") {
    spdlog::warn(
        "resuming from {} with settings that differ from the ones it was trained with "
        "(checkpoint.resume_changed allow); old -> new:{}",
        path, listed);
    return;
  }
  DPT_FAIL(
      "checkpoint {} was trained with other settings; old -> new:{}\nNothing was changed. Restore those settings, "
      "start a new run (--set checkpoint.dir=<new dir>), or continue anyway with --set checkpoint.resume_changed=allow",
      path, listed);
}

namespace {

// optim.kind over `groups` (the whole model's, or, sharded, this rank's pieces of it), from the registry
// (apps/train/optimizers/); the config only lets registered names through.
std::unique_ptr<optim::Optimizer> make_optimizer(const Config& config, std::vector<optim::ParamGroup> groups) {
  const auto* entry = optimizers().find(config.optim.kind);
  DPT_CHECK(entry != nullptr, "optim.kind: '{}' is not a registered optimizer", config.optim.kind);
  return entry->make(config, Settings(config, "optim." + config.optim.kind, entry->settings), std::move(groups));
}

}  // namespace

std::string Trainer::choose_cuda_graph() const {
  const std::string& setting = config_.training.cuda_graph;
  if (setting == "true") return "replayed from a CUDA graph (training.cuda_graph true)";
  if (setting == "false") return "eager (training.cuda_graph false)";
  // auto: whenever a replay can hold the step, DDP's collectives on NCCL included (tested to log the
  // eager run's metrics digit for digit under every strategy).
  const char* why_not = !device_.is_cuda()                                  ? "not on a GPU"
                        : config_.training.grad_accum > 1                   ? "grad_accum > 1"
                        : compute_ == DType::Float16                        ? "fp16's loss scale changes between steps"
                        : group_ && group_->backend_name(device_) != "nccl" ? "collectives not on NCCL"
                                                                            : nullptr;
  if (why_not != nullptr) return fmt::format("eager (training.cuda_graph auto: {})", why_not);
  return "replayed from a CUDA graph after two eager steps (training.cuda_graph auto)";
}

std::string Trainer::choose_update() {
  if (!decides_on_device() || !device_.is_cuda()) return "";
  auto* adam = dynamic_cast<optim::Adam*>(optimizer_.get());
  if (sharded_ || adam == nullptr || !mixed_->fused()) return "decided, then applied";
  if (config_.training.grad_clip > 0) return "decided, then applied (gradient clipping needs the norm first)";
  // The second copy of the float32 masters and both moments, beside the activations still to come.
  const double bytes = 12.0 * static_cast<double>(model_->num_parameters());
  const double activations =
      estimate_training_memory(config_, data_.shape, compute_, device_, env_.world_size).activations;
  const double free = static_cast<double>(cuda::free_memory(device_.index));
  if (bytes + activations > free / 2) {
    return fmt::format(
        "decided, then applied (a second copy of the optimizer state, {}, and the activations would "
        "take over half of the free memory)",
        human_bytes(bytes));
  }
  adam->speculate();
  speculative_ = adam;
  return fmt::format(
      "applied before its decision into a second copy of the optimizer state ({}), kept unless "
      "the step is skipped (training.grad_clip 0: nothing else needs the gradients first)",
      human_bytes(bytes));
}

Trainer::ExchangeChoice Trainer::choose_exchange() const {
  const DistributedConfig& d = config_.distributed;
  ExchangeChoice c;
  if (d.strategy != "auto") {
    c = {d.strategy, false, "distributed.strategy " + d.strategy};
  } else if (!group_) {
    c = {"allreduce", false, "one process"};
  } else if (!device_.is_cuda()) {
    c = {"allreduce", false, "distributed.strategy auto: on CPUs"};
  } else if (compute_ == DType::Float16 || d.comm_dtype != "fp32") {
    c = {"allreduce", false, "distributed.strategy auto: fp16 loss scaling and bf16 communication are not sharded"};
  } else if (config_.model.kind == "mlp" && config_.training.grad_accum == 1 &&
             dist::GatheredLinearZero::shards_evenly(model_->module(), env_.world_size)) {
    c = {"gathered_grads", false, "distributed.strategy auto: an MLP, weight gradients from gathered layer inputs"};
  } else if (config_.model.kind == "gpt" && model_->num_parameters() >= kZeroFromParameters) {
    c = {"zero", false, "distributed.strategy auto: a GPT of 50M parameters or more"};
  } else {
    c = {"allreduce", false, "distributed.strategy auto: a small model"};
  }
  // The copy engines move a sharded optimizer's bytes (zero, gathered_grads) between the GPUs of one host;
  // across nodes NCCL's kernels do.
  c.copy_engines = c.strategy != "allreduce" && device_.is_cuda() &&
                   (d.copy_engines == "true" || (d.copy_engines == "auto" && env_.local_world_size == env_.world_size));
  return c;
}

void Trainer::setup_optimizer() {
  mixed_ = std::make_unique<optim::MixedPrecision>(model_->module()->named_parameters(), compute_);
  const OptimConfig& o = config_.optim;
  // Matmul weights and embeddings decay, biases and LayerNorm parameters do not (the GPT-2 recipe).
  auto groups = optim::weight_decay_groups(mixed_->master_params(), o.weight_decay);
  // Sharded (strategy zero or gathered_grads), the optimizer is built over this rank's pieces once DDP
  // exists (below).
  exchange_ = choose_exchange();
  const bool sharded = exchange_.strategy != "allreduce" && group_ != nullptr;
  if (!sharded) optimizer_ = make_optimizer(config_, groups);
  // bf16 on a GPU: the update reads the model's bf16 gradients and writes its bf16 weights in the same
  // pass (optim/mixed_precision.h fuse_with): no float32 gradient copies, no conversion pass.
  if (optimizer_ && compute_ == DType::BFloat16 && device_.is_cuda()) mixed_->fuse_with(*optimizer_);
  if (resume_from_) {
    gen_.set_state(dropout_seed(config_.training.seed, env_.rank), resume_from_->state.rng_offset);
    const auto& extra = resume_from_->state.extra;
    bad_steps_ = extra_int(*resume_from_, "train.bad_steps");
    // Checkpoints of older runs carry no best validation loss: it starts afresh.
    if (extra.count("train.best_val_step") && extra_int(*resume_from_, "train.best_val_step") >= 0) {
      best_val_step_ = extra_int(*resume_from_, "train.best_val_step");
      best_val_loss_ = extra_double(*resume_from_, "train.best_val_loss");
    }
    // The fp16 loss scale continues where it was (a checkpoint of another precision has none: the
    // scale starts afresh).
    if (optim::LossScaler* scaler = mixed_->loss_scaler(); scaler && extra.count("train.loss_scale")) {
      scaler->load(extra_double(*resume_from_, "train.loss_scale"),
                   extra_int(*resume_from_, "train.loss_scale_growth"));
    }
    train_loader_->set_position(
        {extra_int(*resume_from_, "train.loader_epoch"), extra_int(*resume_from_, "train.loader_batch")});
    const int64_t saved_batch = extra_int(*resume_from_, "train.batch_size");
    const int64_t saved_accum = extra_int(*resume_from_, "train.grad_accum");
    if (saved_batch != config_.training.batch_size || saved_accum != config_.training.grad_accum) {
      spdlog::warn(
          "resuming with training.batch_size {} x grad_accum {} from a run with {} x {}: the data order "
          "continues from the same batch index, not the same example",
          config_.training.batch_size, config_.training.grad_accum, saved_batch, saved_accum);
    }
  }
  // schedule.kind from the registry (apps/train/schedules/).
  const auto* schedule = schedules().find(config_.schedule.kind);
  DPT_CHECK(schedule != nullptr, "schedule.kind: '{}' is not a registered schedule", config_.schedule.kind);
  schedule_ =
      schedule->make(config_, Settings(config_, "schedule." + config_.schedule.kind, schedule->settings), total_steps_);
  if (group_) {
    dist::DataParallelOptions dp;
    dist::DDPOptions& d = dp.ddp;
    d.bucket_cap_mb = config_.distributed.bucket_cap_mb;
    d.first_bucket_mb = config_.distributed.first_bucket_mb;
    d.find_unused_parameters = config_.distributed.find_unused_parameters;
    d.copy_engines = exchange_.copy_engines;
    // bf16 communication of float32 gradients; under bf16/fp16 precision the gradients already are 16-bit.
    // Under fp16 an inf/NaN gradient on one rank is inf/NaN in every rank's AllReduced gradient, so all
    // ranks find the overflow, skip the step and back the loss scale off together.
    if (config_.distributed.comm_dtype == "bf16" && compute_ == DType::Float32) d.comm_dtype = DType::BFloat16;
    dp.sharding = !sharded                       ? dist::Sharding::None
                  : exchange_.strategy == "zero" ? dist::Sharding::Zero
                                                 : dist::Sharding::GatheredGrads;
    // Stepped by the trainer (clipping and skipped steps need every gradient before any update).
    dp.timing = dist::UpdateTiming::OnStep;
    auto make_shard = [&](std::vector<optim::ParamGroup> pieces) { return make_optimizer(config_, std::move(pieces)); };
    dist::DataParallel wrapped;
    try {
      wrapped = dist::wrap_data_parallel(model_->module(), group_, dp, optimizer_.get(), groups, make_shard);
    } catch (const std::exception& e) {
      if (dp.sharding != dist::Sharding::GatheredGrads) throw;
      DPT_FAIL("distributed.strategy gathered_grads: {}", e.what());
    }
    ddp_ = std::move(wrapped.ddp);
    sharded_ = std::move(wrapped.sharded);
  }
  if (resume_from_) {
    // A checkpoint holds the state of whole parameters (a sharded run gathers it when saving): a plain
    // optimizer takes it as it is, a sharded one this rank's pieces of it.
    try {
      if (sharded_) {
        sharded_->load_full_state_dict(resume_from_->optimizer);
      } else {
        optimizer_->load_state_dict(resume_from_->optimizer);
      }
    } catch (const std::exception& e) {
      DPT_FAIL("cannot resume from '{}': its optimizer state does not fit optim.kind {} ({})", resume_path_, o.kind,
               e.what());
    }
    resume_from_.reset();  // the tensors are copied; free the host memory
  }
  if (decides_on_device()) {
    for (auto& readback : readbacks_) readback = std::make_unique<HostReadback>(device_, optim::kStepOutcomeSize);
    if (device_.is_cuda()) {
      stop_flag_ = {static_cast<double*>(cuda::allocate_pinned(sizeof(double))),
                    [](double* p) { cuda::free_pinned(p); }};
    } else {
      stop_flag_ = {new double, [](double* p) { delete p; }};
    }
    *stop_flag_ = 0;
  }
  update_choice_ = choose_update();
  graph_choice_ = choose_cuda_graph();
  if (graph_choice_.rfind("replayed", 0) == 0) {
    // What the graph holds: zeroed gradients, the loss, its backward (apps/train/step_graph.h).
    step_graph_ = std::make_unique<StepGraph>(
        [this](const data::Batch& batch) {
          model_->module()->zero_grad();
          Tensor loss = model_->loss(batch, compute_);
          agree(loss.detach(), 1);  // reads the stop flag afresh each replay (and sums over ranks, unsharded)
          mixed_->scale_loss(loss).backward();
          await_agreement();
          return loss;
        },
        gen_);
  }
}

void Trainer::open_run_dir() {
  if (is_main()) {
    const std::string& dir = config_.checkpoint.dir;
    if (config_.checkpoint.enabled) {
      // Leftovers of crashed saves go; checkpoints newer than the step this run continues from (damaged
      // ones it passed over, or a future it abandons) are moved out of later resumes' way, never deleted.
      for (const auto& line : clean_leftovers(dir)) spdlog::info("checkpoint.dir: {}", line);
      for (const auto& line : set_aside_newer(dir, start_step_)) {
        spdlog::warn("checkpoint.dir: set aside a checkpoint newer than step {}, which this run continues from: {}",
                     start_step_, line);
      }
    }
    fs::create_directories(dir);
    write_config(config_, (fs::path(dir) / "config.yaml").string());
  }
  // From here on a stop signal ends the run after a step, with a checkpoint (apps/train/stop_signal.h).
  defer_stop_signals();
  if (!is_main()) return;
  metrics_ = std::make_unique<MetricsLog>(config_.logging, start_step_, model_->is_gpt());
  progress_ = std::make_unique<ProgressBar>(config_.logging.progress_bar && stdout_is_terminal(), total_steps_);
}

}  // namespace dpt::train
