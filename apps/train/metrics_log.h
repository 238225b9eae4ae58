#pragma once
// What rank 0 reports while training: one JSON object per line in the metrics file (scripts/
// plot-metrics.sh draws it), a log line every logging.every steps, and a progress bar when stdout is
// a terminal.
//
// Records: {"type": "train", "step", "loss", "lr", "grad_norm", "step_ms", "throughput",
// "throughput_per_gpu", "unit", "mfu", "elapsed_s", "skipped"} (plus "loss_scale" under fp16) and
// {"type": "eval", "step", "val_loss", "best_val_loss", "best_step"} (the best so far, this one included).
// Numbers are written in their shortest exact form, so two runs can be compared digit for digit;
// non-finite values are written as null (JSON has no NaN).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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
  bool skipped = false;  // non-finite: no update was applied
  double loss_scale = 0;  // fp16 loss scale of the step; 0: no loss scaling (not written)
};

class MetricsLog {
 public:
  // Opens `path` for appending. When resuming from `keep_through_step` > 0, records of later steps
  // (written by the interrupted run after its last checkpoint) are dropped first; 0 starts a new file.
  MetricsLog(const std::string& path, int64_t keep_through_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void train(const TrainRecord& r);
  void eval(int64_t step, double val_loss, double best_val_loss, int64_t best_step);

 private:
  void write_line(const std::string& line);
  std::FILE* file_ = nullptr;
  std::string path_;
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
