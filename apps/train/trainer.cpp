// The training loop. One optimizer step, as the code below follows it:
//   1. the learning rate for this step (a pure function of the step: resuming needs nothing else)
//   2. grad_accum micro-batches: forward, backward of loss / grad_accum; DDP averages gradients
//      across ranks during the LAST backward only (no_sync() on the others)
//   3. gradients to the float32 masters (mixed precision; under fp16 unscaled and checked for inf/NaN),
//      global norm, clipping
//   4. the ranks agree on the step's outcome: mean loss, whether any rank saw a non-finite loss or
//      norm, whether any rank was asked to stop — so every rank takes the same branch below
//   5. the update (or, when non-finite, no update), masters back to the model, gradients zeroed; under
//      fp16 the loss scale backs off after a skipped step and grows after enough finite ones
//   6. logging, evaluation and checkpoints at their intervals
// Parts 3 to 5 are decided on the device where they can be (optim/step_outcome.h: the norm, the clip
// factor, the skip and the agreement stay there, and the update reads them), so the host launches step
// k + 1 before it reads step k's loss and the device never waits for it. The agreement's sum over ranks
// (loss and stop; a non-finite loss anywhere makes the sum non-finite) is launched once the last forward has
// run, behind backward's compute, or, sharded, in the norm's sum after backward. Only fp16 loss scaling
// decides on the host. Under training.cuda_graph, part 2 (one micro-batch, the agreement with it) is
// replayed from a CUDA graph after kEagerSteps eager steps (apps/train/step_graph.h); everything else is
// the same code.
#include "trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <set>

#include "checkpointing.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/gpt.h"
#include "optim/grad_clip.h"
#include "optim/step_outcome.h"
#include "run_settings.h"
#include "stop_signal.h"
#include "text_sample.h"
#include "vocab_metadata.h"

namespace dpt::train {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool every(int64_t step, int64_t interval) { return interval > 0 && step % interval == 0; }

}  // namespace

std::vector<double> Trainer::sum_over_ranks(const std::vector<double>& values) {
  if (!group_) return values;
  Tensor t = from_vector(values, {static_cast<int64_t>(values.size())},
                         TensorOptions{}.with_dtype(DType::Float64).with_device(device_));
  group_->allreduce(t, dist::ReduceOp::Sum)->wait();
  return t.to_vector<double>();
}

Tensor Trainer::forward_backward(int64_t step) {
  const int64_t accum = config_.training.grad_accum;
  // The loss of each micro-batch stays on the device. Under training.cuda_graph (one micro-batch), steps
  // after the first kEagerSteps replay a captured one.
  Tensor loss_sum;
  const bool replay = in_graph(step);
  for (int64_t micro = 0; micro < accum; ++micro) {
    data::Batch batch = train_loader_->next();
    if (replay) {
      loss_sum = step_graph_->run(batch).detach();
      continue;
    }
    const bool last = micro + 1 == accum;
    std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
    if (ddp_ && !last) no_sync.emplace(*ddp_);
    Tensor loss = model_->loss(batch, compute_);
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
    if (last) agree(loss_sum, accum);
    // Under fp16 backward starts from loss * loss scale (optim/loss_scaler.h); the identity otherwise.
    mixed_->scale_loss(accum > 1 ? loss * (1.0 / static_cast<double>(accum)) : loss).backward();
    if (last) await_agreement();
  }
  return loss_sum;
}

void Trainer::agree(const Tensor& loss_sum, int64_t micro_batches) {
  if (!decides_on_device()) return;
  agreed_ = optim::step_agreement(loss_sum, micro_batches, stop_flag_.get());
  // Sharded, it rides on the norm's sum after backward (decide_on_device). Otherwise it is launched before
  // backward, so its latency hides behind backward's compute (every rank launches it at the same point,
  // ahead of DDP's bucket collectives).
  if (group_ && !sharded_) agreement_ = group_->allreduce(agreed_, dist::ReduceOp::Sum);
}

void Trainer::await_agreement() {
  if (!agreement_) return;
  agreement_->wait();  // on a GPU the stream waits, not the host
  agreement_.reset();
}

void Trainer::decide_on_device(HostReadback& readback) {
  Tensor agreed = agreed_;
  Tensor sum_of_squares;
  if (sharded_) {
    // Sharded, the update reads this rank's averaged (bf16 or float32) gradients themselves, and each rank
    // holds a share of them: the squared norm is the shares' sum. The agreement goes in the same sum. Summed
    // during backward instead, its kernel holds an SM while it waits for the slowest rank, and backward's
    // GEMMs that need every SM wait for it; here the ranks have just met in the last bucket's exchange.
    const Tensor sums = concat({agreed_, sharded_->grad_sum_of_squares()}, 0);
    group_->allreduce(sums, dist::ReduceOp::Sum)->wait();
    agreed = sums.slice(0, 2);
    sum_of_squares = sums.slice(2, 3);
  } else if (speculative_) {
    // The update goes first, into copies that do not count yet, and sums the gradients' squares as it reads
    // them; the outcome then keeps it, or a skip leaves everything as it was (optim/adam.h).
    optimizer_->step();
    readback.copy(speculative_->resolve(agreed));
    return;
  } else {
    mixed_->grads_to_master();  // float32 copies of 16-bit gradients, unless the update reads them itself
    std::vector<Tensor> with_grads;
    for (const auto& [name, t] : mixed_->gradient_params()) with_grads.push_back(t);
    sum_of_squares = optim::grad_sum_of_squares(with_grads, device_);
  }
  // From the loss and stop summed over ranks and a norm every rank computed alike: every rank's update reads
  // the same skip and clip factor.
  Tensor outcome = optim::step_outcome(agreed, sum_of_squares, config_.training.grad_clip);
  optimizer().set_gate(outcome.slice(optim::kStepSkip, optim::kGradScale + 1));
  // A skip leaves parameters, optimizer state and its step count untouched.
  if (sharded_) {
    // The model's parameters are all-gathered (nothing to copy from the masters); under gathered gradients
    // the next forward waits for each layer's weight itself (distributed/gathered_linear_zero.h).
    sharded_->step();
  } else {
    optimizer_->step();
    mixed_->masters_to_model();
  }
  readback.copy(outcome);
}

Trainer::StepResult Trainer::decide_on_host(const Tensor& loss_sum) {
  const int64_t accum = config_.training.grad_accum;
  // Masters, norm, clipping (a non-finite norm is returned unclipped). Under fp16 an inf/NaN gradient
  // (one device flag read) skips the norm: the step will be skipped anyway.
  StepResult r;
  r.loss_scale = mixed_->loss_scale();
  const bool finite_grads = mixed_->grads_to_master();
  const NamedTensors& with_grads = mixed_->gradient_params();
  const double clip = config_.training.grad_clip;
  if (!finite_grads) {
    r.grad_norm = std::numeric_limits<double>::infinity();
  } else if (clip > 0) {
    r.grad_norm = optim::clip_grad_norm(with_grads, clip);
  } else {
    std::vector<Tensor> tensors;
    for (const auto& [name, t] : with_grads) tensors.push_back(t);
    r.grad_norm = optim::grad_norm(tensors);
  }
  const double local_loss = loss_sum.item() / static_cast<double>(accum);
  // Agreement across ranks. (Under DDP an inf gradient on one rank is inf in every rank's AllReduced
  // gradient already; the agreement makes the skip explicit for any cause.)
  const bool bad = !std::isfinite(local_loss) || !std::isfinite(r.grad_norm);
  std::vector<double> agreed = sum_over_ranks({local_loss, bad ? 1.0 : 0.0, stop_signal() != 0 ? 1.0 : 0.0});
  r.loss = agreed[0] / env_.world_size;
  r.skipped = agreed[1] > 0;
  if (agreed[2] > 0) r.stop_signal = stop_signal() != 0 ? stop_signal() : SIGTERM;
  // A gradient overflow of loss scaling with a finite loss is routine, not a bad step: the scale was too
  // large. Below a scale of 1 the gradients overflow unscaled, which is divergence, not the scale.
  r.overflow = r.skipped && std::isfinite(r.loss) && r.loss_scale >= 1;
  // The update (a skipped step leaves parameters, optimizer state and its step counter untouched).
  if (!r.skipped) {
    optimizer_->step();
    mixed_->masters_to_model();
  }
  mixed_->update_scale(r.skipped);
  return r;
}

Trainer::LaunchedStep Trainer::launch_step(int64_t step) {
  LaunchedStep launched;
  launched.step = step + 1;
  launched.launched_at = now_seconds();
  launched.lr = schedule_->lr(step);
  optimizer().set_lr(launched.lr);
  if (stop_flag_) *stop_flag_ = stop_signal() != 0 ? 1.0 : 0.0;
  const Tensor loss_sum = forward_backward(step);
  if (decides_on_device()) {
    launched.readback = readbacks_[static_cast<size_t>(step % 2)].get();
    decide_on_device(*launched.readback);
  } else {
    launched.result = decide_on_host(loss_sum);
  }
  // (ZeRO's pieces view DDP's gradient buckets, which the module's zero_grad below clears; gathered
  // gradients are overwritten by the next backward.)
  if (!sharded_) optimizer_->zero_grad();
  // When the next step replays (or captures: its graph zeroes them itself), a replayed backward overwrites
  // the gradients; a zero_grad here would make that step's first gradient read zero what the replay
  // wrote (apps/train/step_graph.h).
  if (!in_graph(step + 1)) model_->module()->zero_grad();
  return launched;
}

// fp16's loss scale is decided on the host (and fp16 is never sharded: the config refuses it).
bool Trainer::decides_on_device() const { return mixed_->loss_scaler() == nullptr; }

int Trainer::complete(const LaunchedStep& launched) {
  StepResult r;
  if (launched.result) {
    r = *launched.result;
  } else {
    const std::vector<double> v = launched.readback->values();
    r.loss = v[optim::kStepLoss] / env_.world_size;
    r.skipped = v[optim::kStepSkip] > 0;
    r.grad_norm = v[optim::kGradNorm];
    if (v[optim::kStepStop] > 0) r.stop_signal = stop_signal() != 0 ? stop_signal() : SIGTERM;
  }
  r.lr = launched.lr;
  // The step's time: from its launch, or from the previous step's end when the host launched it before
  // that (steps overlapping), to its end as the host sees it.
  const double now = now_seconds();
  const double seconds = now - std::max(launched.launched_at, last_completed_at_);
  last_completed_at_ = now;
  const int64_t step = launched.step;
  log_step(step, r, seconds);
  if (r.overflow) {
    if (is_main()) progress_->clear();
    if (is_main())
      spdlog::info("step {}: fp16 gradient overflow at loss scale {:g}: update skipped, loss scale now {:g}", step,
                   r.loss_scale, mixed_->loss_scale());
  } else if (r.skipped) {
    ++bad_steps_;
    if (is_main()) progress_->clear();
    if (is_main())
      spdlog::warn("step {}: non-finite {} (loss {}, grad norm {}): update skipped ({} of at most {})", step,
                   std::isfinite(r.loss) ? "gradient norm" : "loss", r.loss, r.grad_norm, bad_steps_,
                   config_.training.max_bad_steps);
    DPT_CHECK(bad_steps_ <= config_.training.max_bad_steps,
              "stopping: {} non-finite steps exceed training.max_bad_steps ({}). Lower optim.lr, enable "
              "training.grad_clip, or check the data; the newest checkpoint in {} is untouched",
              bad_steps_, config_.training.max_bad_steps, config_.checkpoint.dir);
  }
  return r.stop_signal;
}

Trainer::Evaluation Trainer::evaluate() {
  if (!val_loader_ || eval_batches_ == 0) return {std::nan(""), -1};
  if (sharded_) sharded_->wait_for_parameters();
  nn::Module& module = *model_->module();
  NoGradGuard no_grad;
  module.eval();
  val_loader_->set_position({0, 0});  // the same validation batches every time
  const bool classifier = model_->is_classifier();
  Tensor sum;
  double correct = 0, examples = 0;
  for (int64_t i = 0; i < eval_batches_; ++i) {
    const data::Batch batch = val_loader_->next();
    Tensor loss;
    if (classifier) {
      Model::Scored s = model_->score(batch, compute_);
      loss = s.loss;
      correct += static_cast<double>(s.correct);
      examples += static_cast<double>(batch.target.size(0));
    } else {
      loss = model_->loss(batch, compute_);
    }
    sum = sum.defined() ? sum + loss : loss;
  }
  module.train();
  const double local = sum.item() / static_cast<double>(eval_batches_);
  // Counts, not per-rank fractions, are summed: the accuracy is that of every example evaluated.
  const std::vector<double> total = sum_over_ranks({local, correct, examples});
  return {total[0] / env_.world_size, classifier ? total[1] / total[2] : -1};
}

std::string Trainer::quality_text(const Evaluation& val) const {
  if (model_->is_gpt()) return fmt::format(", perplexity {:.2f}", std::exp(val.loss));
  return val.accuracy >= 0 ? fmt::format(", accuracy {:.4f}", val.accuracy) : "";
}

void Trainer::record_eval(int64_t step, const Evaluation& e) {
  const double val = e.loss;
  if (!std::isfinite(val)) return;
  if (val < best_val_loss_) {
    best_val_loss_ = val;
    best_val_step_ = step;
  }
  if (!is_main()) return;
  metrics_->eval(step, val, best_val_loss_, best_val_step_, e.accuracy);
  progress_->clear();
  if (step < total_steps_) {
    spdlog::info("step {}: validation loss {:.4f}{} (best {:.4f} at step {})", step, val, quality_text(e),
                 best_val_loss_, best_val_step_);
  }
}

std::string Trainer::save(int64_t step) {
  std::string path;
  // Sharded, every rank takes part in assembling the whole masters and optimizer state.
  NamedTensors sharded_state;
  if (sharded_) {
    sharded_->gather_targets();
    sharded_state = sharded_->full_state_dict();
  }
  if (is_main()) {
    // Float32 masters (the true weights under mixed precision) and the persistent buffers.
    optimizer().settle();
    NamedTensors state = mixed_->master_params();
    std::set<std::string> params;
    for (const auto& [name, t] : model_->module()->named_parameters()) params.insert(name);
    for (const auto& [name, t] : model_->module()->state_dict())
      if (!params.count(name)) state.emplace_back(name, t);
    optim::TrainingState ts;
    ts.step = step;
    ts.rng_seed = static_cast<uint64_t>(config_.training.seed);
    ts.rng_offset = gen_.offset();
    const data::LoaderPosition pos = train_loader_->position();
    ts.extra = {{"train.world_size", std::to_string(env_.world_size)},
                {"train.loader_epoch", std::to_string(pos.epoch)},
                {"train.loader_batch", std::to_string(pos.batch)},
                {"train.bad_steps", std::to_string(bad_steps_)},
                {"train.best_val_loss", fmt::format("{}", best_val_loss_)},
                {"train.best_val_step", std::to_string(best_val_step_)},
                {"train.total_steps", std::to_string(total_steps_)},
                {"train.batch_size", std::to_string(config_.training.batch_size)},
                {"train.grad_accum", std::to_string(config_.training.grad_accum)},
                {"train.model", model_->description()},
                {"train.config_file", config_.source_file}};
    // A character model's vocabulary, so its checkpoints decode without the text (dpt-generate).
    if (data_.vocab) ts.extra[kCharVocabKey] = encode_char_vocab(*data_.vocab);
    record_settings(computation_settings(config_, env_.world_size), ts.extra);
    if (const optim::LossScaler* scaler = mixed_->loss_scaler()) {
      ts.extra["train.loss_scale"] = fmt::format("{}", scaler->scale());
      ts.extra["train.loss_scale_growth"] = std::to_string(scaler->growth_tracker());
    }
    path = save_run_checkpoint(config_.checkpoint.dir, state, sharded_ ? sharded_state : optimizer_->state_dict(), ts,
                               config_.checkpoint.keep);
    progress_->clear();
    spdlog::info("step {}: checkpoint {}", step, path);
  }
  // Nobody runs ahead (or exits) while rank 0 is still writing.
  if (group_) group_->barrier()->wait();
  return path;
}

void Trainer::log_step(int64_t step, const StepResult& r, double step_seconds) {
  if (!is_main()) return;
  if (step > start_step_ + 1) {  // the first step of a process warms caches up: not counted for the ETA
    train_seconds_ += step_seconds;
    ++timed_steps_;
  }
  progress_->update(step, r.loss);
  const bool due = step == start_step_ + 1 || every(step, config_.logging.every) || step == total_steps_ || r.skipped;
  if (!due) return;
  const double units =
      static_cast<double>(config_.training.batch_size * config_.training.grad_accum * model_->units_per_example());
  TrainRecord rec;
  rec.step = step;
  rec.loss = r.loss;
  rec.lr = r.lr;
  rec.grad_norm = r.grad_norm;
  rec.step_ms = step_seconds * 1e3;
  rec.throughput_per_gpu = units / step_seconds;
  rec.throughput = rec.throughput_per_gpu * env_.world_size;
  rec.unit = std::string(model_->unit()) + "/s";
  if (device_.is_cuda() && model_->flops_per_unit() > 0) {
    rec.mfu = model_->flops_per_unit() * rec.throughput_per_gpu / (peak_tflops_ * 1e12);
  }
  rec.elapsed_s = now_seconds() - start_time_;
  rec.skipped = r.skipped;
  if (mixed_->loss_scaler()) rec.loss_scale = r.loss_scale;
  metrics_->train(rec);
  const double per_step = timed_steps_ > 0 ? train_seconds_ / static_cast<double>(timed_steps_) : step_seconds;
  const int width = static_cast<int>(std::to_string(total_steps_).size());
  std::string line = fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4g} | {} {} ({} per {})",
                                 step, width, total_steps_, r.loss, rec.lr, r.grad_norm, human_count(rec.throughput),
                                 rec.unit, human_count(rec.throughput_per_gpu), device_.is_cuda() ? "GPU" : "process");
  if (rec.mfu >= 0) line += fmt::format(" | MFU {:.1f}%", rec.mfu * 100);
  if (mixed_->loss_scaler()) line += fmt::format(" | loss scale {:g}", r.loss_scale);
  line += fmt::format(" | {:.1f} ms/step | ETA {}", rec.step_ms,
                      human_duration(per_step * static_cast<double>(total_steps_ - step)));
  progress_->clear();
  spdlog::info("{}", line);
}

void Trainer::print_sample() {
  if (!is_main() || !model_->is_gpt() || config_.eval.sample_tokens <= 0) return;
  if (sharded_) sharded_->wait_for_parameters();  // a cached forward runs no Sequential (zero_optimizer.h)
  int32_t start = 0;
  if (data_.vocab && data_.vocab->chars().find('\n') != std::string::npos) start = data_.vocab->encode('\n');
  auto& gpt = static_cast<nn::GPT&>(*model_->module());
  std::vector<int32_t> ids =
      sample_tokens(gpt, start, config_.eval.sample_tokens, static_cast<uint64_t>(config_.training.seed));
  spdlog::info("sample ({} tokens{}):\n{}", ids.size(), data_.vocab ? "" : ", as ids", render_tokens(ids, data_.vocab));
}

int Trainer::run() {
  start_time_ = now_seconds();
  // Setup, in dependency order; nothing is written to the run directory until it has all succeeded.
  setup_device();
  setup_data();
  setup_model();
  resume_or_start();
  setup_optimizer();
  open_run_dir();

  const std::string device_text = device_.is_cuda() ? fmt::format("{} ({})", device_.str(), device_name_) : "cpu";
  spdlog::info("model   {}", model_->description());
  spdlog::info("data    {}: {} training / {} validation examples", data_.train->describe(), data_.train->size(),
               data_.val ? data_.val->size() : 0);
  const std::string sharding = !sharded_
                                   ? ""
                                   : fmt::format(", optimizer sharded (ZeRO-1{}{})",
                                                 exchange_.strategy == "zero" ? "" : " from gathered layer inputs",
                                                 exchange_.copy_engines ? ", exchanged by the copy engines" : "");
  spdlog::info("run     {} steps of {} x {} {} per process, {} process(es) on {}, {}{}{}", total_steps_,
               config_.training.grad_accum, config_.training.batch_size, model_->is_gpt() ? "sequences" : "examples",
               env_.world_size, device_text,
               compute_ == DType::BFloat16  ? "bf16 (float32 masters)"
               : compute_ == DType::Float16 ? "fp16 (float32 masters, dynamic loss scaling)"
                                            : "fp32",
               env_.world_size > 1 ? fmt::format(", {} via {}", group_->backend_name(device_), env_.source) : "",
               sharding);
  spdlog::info("output  {} (config.yaml, {}checkpoints)", config_.checkpoint.dir,
               config_.logging.metrics_file.rfind(config_.checkpoint.dir, 0) == 0 ? "metrics.jsonl, " : "");
  spdlog::info("steps   {}", graph_choice_);
  if (!update_choice_.empty()) spdlog::info("update  {}", update_choice_);
  if (group_) {
    spdlog::info("exchange {}{} ({})", exchange_.strategy, exchange_.copy_engines ? " on the copy engines" : "",
                 exchange_.why);
  }
  if (start_step_ > 0) spdlog::info("resuming from {} at step {}", resume_path_, start_step_);
  if (start_step_ >= total_steps_) {
    spdlog::info(
        "training already finished: step {} of {} is done. To train again, use a new directory "
        "(--set checkpoint.dir=...) or --set checkpoint.resume=never",
        start_step_, total_steps_);
    return 0;
  }

  model_->module()->train();
  const bool checkpoints = config_.checkpoint.enabled;
  // On a GPU each step is launched before the previous one's result is read, so the device always has a
  // step queued while the host waits. A step after which the host needs its parameters (evaluation, a
  // checkpoint, the end) or a decision (a step decided on the host) is completed at once. On the CPU a
  // launch runs the whole step, so each is completed at once too: completing it after the next launch
  // would time each step by the next one's work, and the last by nothing.
  std::optional<LaunchedStep> pending;
  int stop = 0;
  int64_t step = start_step_;
  last_completed_at_ = now_seconds();
  while (step < total_steps_ && stop == 0) {
    LaunchedStep launched = launch_step(step);
    ++step;  // steps launched
    if (pending) stop = complete(*pending);
    pending.reset();
    const bool evaluates = step < total_steps_ && every(step, config_.eval.every);
    const bool saves = checkpoints && step < total_steps_ && every(step, config_.checkpoint.every);
    if (stop == 0 && !evaluates && !saves && step < total_steps_ && launched.readback && device_.is_cuda()) {
      pending = std::move(launched);
      continue;
    }
    if (const int s = complete(launched); stop == 0) stop = s;
    if (stop != 0) break;
    if (evaluates) record_eval(step, evaluate());
    if (saves) save(step);
  }
  if (stop != 0) {
    const std::string path = checkpoints ? save(step) : "";
    if (is_main()) {
      spdlog::warn("stopped by {} after step {}{}", stop == SIGINT ? "SIGINT" : "SIGTERM", step,
                   checkpoints ? "; run the same command again to resume from " + path : "");
    }
    return 128 + stop;
  }
  if (progress_) progress_->finish();

  // The end: evaluation, the final checkpoint, a text sample for language models.
  const Evaluation val = evaluate();
  record_eval(total_steps_, val);
  if (is_main() && std::isfinite(val.loss)) {
    spdlog::info("validation loss {:.4f}{} after {} steps; best {:.4f} at step {}", val.loss, quality_text(val),
                 total_steps_, best_val_loss_, best_val_step_);
  }
  if (checkpoints) save(total_steps_);
  print_sample();
  if (is_main()) spdlog::info("done in {:.1f} s", now_seconds() - start_time_);
  return 0;
}

}  // namespace dpt::train
