#pragma once
// What rank 0 reports while training: every record goes to the metrics sinks (the JSONL metrics file
// always, metrics.csv under logging.csv, a TensorBoard event file under logging.tensorboard), a log
// line every logging.every steps, and a progress bar when stdout is a terminal.
//
// JSONL records: {"type": "train", "step", "loss", "lr", "grad_norm", "step_ms", "throughput",
// "throughput_per_gpu", "unit", "mfu", "elapsed_s", "skipped"} (plus "loss_scale" under fp16) and
// {"type": "eval", "step", "val_loss", "best_val_loss", "best_step"} (the best so far, this one included;
// plus "val_perplexity", exp(val_loss), for language models, and "val_accuracy", the fraction of
// validation examples whose largest logit is their label, for classifiers).
// Numbers are written in their shortest exact form, so two runs can be compared digit for digit;
// non-finite values are written as null (JSON has no NaN).
//
// A sink that cannot write (a full disk) throws naming its file: the run stops rather than train on
// without its metrics.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config.h"

namespace dpt::train {

struct TrainRecord {
  int64_t step = 0;  // steps completed, 1-based
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double throughput = 0;          // units per second, all ranks
  double throughput_per_gpu = 0;  // per rank
  std::string unit;               // "samples/s" or "tokens/s"
  double mfu = -1;                // < 0: not measured (CPU, or a model without a FLOP count)
  double elapsed_s = 0;
  bool skipped = false;   // non-finite: no update was applied
  double loss_scale = 0;  // fp16 loss scale of the step; 0: no loss scaling (not written)
};

struct EvalRecord {
  int64_t step = 0;
  double val_loss = 0;
  double best_val_loss = 0;  // the lowest validation loss so far, this one included
  int64_t best_step = 0;     // ... and its step
  double perplexity = -1;    // exp(val_loss) for language models; < 0: not reported
  double accuracy = -1;      // classifiers: fraction of argmax == label; < 0: not reported
};

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void train(const TrainRecord& r) = 0;
  virtual void eval(const EvalRecord& r) = 0;
};

// A text file of one record per line, flushed after each (a reader such as a plot, a test or tail -f
// sees every record as soon as it is logged). When resuming from keep_through_step > 0, the lines of
// later steps (written by the interrupted run after its last checkpoint) are dropped first; `step_of`
// reads a line's step (-1 for a line without one, which is kept); 0 starts a new file. A non-empty
// `header` is the first line.
class RecordFile {
 public:
  RecordFile(std::string path, int64_t keep_through_step, const std::function<int64_t(const std::string&)>& step_of,
             const std::string& header = "");
  ~RecordFile();
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;
  void write_line(const std::string& line);  // throws naming the file when the write fails
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

class MetricsLog {
 public:
  // The sinks `logging` asks for, beside logging.metrics_file, opened for a run resuming after
  // `keep_through_step` (0: a new run). `language_model`: evaluations also report perplexity.
  MetricsLog(const LoggingConfig& logging, int64_t keep_through_step, bool language_model);

  void train(const TrainRecord& r);
  // `accuracy` < 0: not a classifier (nothing reported).
  void eval(int64_t step, double val_loss, double best_val_loss, int64_t best_step, double accuracy = -1);

 private:
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
  bool language_model_;
};

// "1.23k", "4.56M": throughput in log lines.
std::string human_count(double value);
// "1h02m", "3m05s", "12s".
std::string human_duration(double seconds);

// A one-line progress bar redrawn in place on a terminal; draws nothing otherwise.
class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t total);
  void update(int64_t step, double loss);
  void clear();  // before printing a log line over it
  void finish();

 private:
  bool enabled_;
  int64_t total_;
  bool drawn_ = false;
  double last_draw_ = 0;
};

// Whether stdout is a terminal.
bool stdout_is_terminal();

}  // namespace dpt::train
