#pragma once
// Trainer: runs one training job described by a Config, on one process of a (possibly one-process)
// data-parallel job. Setup resolves the device (the local rank's GPU when there is one, else the CPU),
// joins the process group when WORLD_SIZE > 1, builds data, model, mixed precision, optimizer, LR
// schedule and DDP, and resumes from a checkpoint; run() is the numbered training loop.
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "collectives/process_group.h"
#include "config.h"
#include "core/factory.h"
#include "core/host_readback.h"
#include "data/loader.h"
#include "data_factory.h"
#include "distributed/ddp.h"
#include "distributed/sharded_optimizer.h"
#include "metrics_log.h"
#include "model_factory.h"
#include "optim/adam.h"
#include "optim/checkpoint.h"
#include "optim/lr_schedule.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "rendezvous/env.h"
#include "step_graph.h"

namespace dpt::train {

class Trainer {
 public:
  explicit Trainer(Config config);
  ~Trainer();

  // Trains to the last step. Returns the process exit code: 0 when done, 128 + signal when stopped by
  // SIGINT/SIGTERM after writing a checkpoint. Errors (including too many non-finite steps) throw.
  int run();

 private:
  // --- setup (trainer_setup.cpp) ---
  void setup_device();
  void setup_data();
  void setup_model();
  void resume_or_start();  // picks the checkpoint, loads weights (fp32, before mixed precision)
  // Throws listing each computation setting the checkpoint was trained with that this config changes,
  // unless checkpoint.resume_changed is allow (then a warning); apps/train/run_settings.h.
  void check_settings_unchanged(const optim::Checkpoint& checkpoint, const std::string& path) const;
  void setup_optimizer();  // mixed precision, optimizer (+ its checkpointed state), schedule, DDP
  // Only once nothing can fail any more: leftovers of crashed saves removed, checkpoints newer than the
  // start step set aside, resolved config and metrics written; stop signals wait for a step from here.
  void open_run_dir();
  // How steps run, and why: "replayed from a CUDA graph ..." or "eager (...)".
  std::string choose_cuda_graph() const;
  std::string graph_choice_;
  // When the update runs, and why: before its decision (Adam::speculate) where nothing but the non-finite
  // skip needs the gradients first; empty where the step is not decided on the device.
  std::string choose_update();
  std::string update_choice_;
  optim::Adam* speculative_ = nullptr;  // the optimizer, when it updates before the decision
  // How gradients are exchanged under several processes (distributed.strategy, resolved), and why.
  struct ExchangeChoice {
    std::string strategy;  // allreduce | zero | gathered_grads
    bool copy_engines = false;
    std::string why;
  };
  ExchangeChoice choose_exchange() const;
  // The auto strategy's threshold for ZeRO-1 on GPTs: GPT-2 124M gains from it, the 4M tiny GPT does not
  // (docs/performance.md).
  static constexpr int64_t kZeroFromParameters = 50'000'000;
  ExchangeChoice exchange_;

  // --- the loop's pieces (trainer.cpp) ---
  struct StepResult {
    double loss = 0;        // mean over micro-batches and ranks
    double grad_norm = 0;   // before clipping
    bool skipped = false;   // non-finite: no update
    bool overflow = false;  // skipped for an fp16 gradient overflow (loss scaling backs off; not a bad step)
    double loss_scale = 1;  // the scale this step's backward used (1 without loss scaling)
    double lr = 0;          // the learning rate it updated with
    int stop_signal = 0;    // some rank was asked to stop
  };
  // A step enqueued: its result, when the host decided it (fp16 loss scaling), or
  // the readback its outcome is on its way to (decided on the device: optim/step_outcome.h).
  struct LaunchedStep {
    int64_t step = 0;  // steps completed once it has run
    double launched_at = 0;
    double lr = 0;
    std::optional<StepResult> result;
    HostReadback* readback = nullptr;
  };
  LaunchedStep launch_step(int64_t step);
  Tensor forward_backward(int64_t step);  // the micro-batches; returns their summed loss, on the device
  bool decides_on_device() const;
  // The agreement (optim/step_outcome.h) of the step whose forward made `loss_sum`, summed over ranks behind
  // the backward that follows (sharded: with the norm, after it); await_agreement() after that backward.
  // Decided on the device only.
  void agree(const Tensor& loss_sum, int64_t micro_batches);
  void await_agreement();
  void decide_on_device(HostReadback& readback);
  StepResult decide_on_host(const Tensor& loss_sum);  // fp16 loss scaling
  // Reads the step's result (waiting for the device, if it decided) and acts on it: the log line and,
  // for a skipped step, a warning and the bad-step count (throwing past training.max_bad_steps). Returns
  // the stop signal the ranks agreed on, or 0.
  int complete(const LaunchedStep& launched);
  // Two, for a step's outcome to arrive while the next step's is copied.
  std::array<std::unique_ptr<HostReadback>, 2> readbacks_;
  // This process's stop request as the device reads it when it computes the agreement: page-locked on a GPU,
  // so a replayed graph reads each step's value.
  std::unique_ptr<double, void (*)(double*)> stop_flag_{nullptr, nullptr};
  Tensor agreed_;                          // the current step's agreement (a replayed graph rewrites it)
  std::shared_ptr<dist::Work> agreement_;  // its sum over ranks, in flight during backward
  double last_completed_at_ = 0;
  // The mean validation loss over eval.batches (NaN without validation data) and, for classifiers, the
  // fraction of those examples whose largest logit is their label (-1 otherwise); over all ranks.
  struct Evaluation {
    double loss = 0;
    double accuracy = -1;
  };
  Evaluation evaluate();
  std::string save(int64_t step);
  void log_step(int64_t step, const StepResult& r, double step_seconds);
  void print_sample();
  // Element-wise sum over ranks of a few host numbers (identity for one process).
  std::vector<double> sum_over_ranks(const std::vector<double>& values);
  bool is_main() const { return env_.rank == 0; }

  Config config_;
  dist::DistEnv env_;
  Device device_ = Device::cpu();
  std::string device_name_ = "cpu";  // "NVIDIA H100 80GB HBM3" on a GPU
  double peak_tflops_ = 0;           // bf16 dense peak of the GPU, for MFU
  DType compute_ = DType::Float32;
  std::shared_ptr<dist::ProcessGroup> group_;

  DataBundle data_;
  std::unique_ptr<data::Loader> train_loader_;
  std::unique_ptr<data::Loader> val_loader_;
  int64_t eval_batches_ = 0;
  int64_t total_steps_ = 0;

  Generator gen_;  // model init, then dropout (the model keeps a pointer to it)
  std::unique_ptr<Model> model_;
  std::optional<optim::Checkpoint> resume_from_;
  std::string resume_path_;
  std::unique_ptr<optim::MixedPrecision> mixed_;
  // Null under the zero and gathered_grads strategies: sharded_ holds this rank's shard.
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::Optimizer& optimizer() { return sharded_ ? sharded_->optimizer() : *optimizer_; }
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<dist::DistributedDataParallel> ddp_;
  // Strategy zero or gathered_grads (with DDP): the update runs on step(), sharded
  // (distributed/sharded_optimizer.h). Declared after ddp_, which it refers to.
  std::unique_ptr<dist::ShardedOptimizer> sharded_;
  // training.cuda_graph: forward and backward replayed from a graph captured after kEagerSteps eager
  // steps of this process (they create the gradients, library handles and DDP's rebuilt buckets).
  static constexpr int64_t kEagerSteps = 2;
  std::unique_ptr<StepGraph> step_graph_;
  // True when `step` is captured or replayed (its forward and backward run from step_graph_).
  bool in_graph(int64_t step) const { return step_graph_ && step >= start_step_ + kEagerSteps; }

  int64_t start_step_ = 0;
  int64_t bad_steps_ = 0;
  // The lowest validation loss so far and the step it was measured at (kept across resumes).
  double best_val_loss_ = std::numeric_limits<double>::infinity();
  int64_t best_val_step_ = -1;
  void record_eval(int64_t step, const Evaluation& val);
  // ", perplexity 4.34" for language models, ", accuracy 0.9750" for classifiers.
  std::string quality_text(const Evaluation& val) const;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<ProgressBar> progress_;
  double train_seconds_ = 0;  // time spent in steps since start (for ETA)
  int64_t timed_steps_ = 0;
  double start_time_ = 0;
};

}  // namespace dpt::train
