#include "metrics_log_csv.h"

#include <charconv>

#include "core/error.h"

namespace dpt::train {

namespace {

// The step column of a row, or -1 for the header or a malformed row.
int64_t csv_step(const std::string& row) {
  const size_t begin = row.find(',');
  if (begin == std::string::npos) return -1;
  int64_t step = -1;
  const char* first = row.data() + begin + 1;
  auto [end, ec] = std::from_chars(first, row.data() + row.size(), step);
  return ec == std::errc() && (end == row.data() + row.size() || *end == ',') ? step : -1;
}

std::string cell(double v) { return fmt::format("{}", v); }

class CsvSink : public MetricsSink {
 public:
  CsvSink(const std::string& path, int64_t keep_through_step)
      : file_(path, keep_through_step, csv_step, kMetricsCsvHeader) {}

  void train(const TrainRecord& r) override {
    file_.write_line(fmt::format("train,{},{},{},{},{:.3f},{:.1f},{:.1f},{},{},{:.3f},{},{},,,,,", r.step, cell(r.loss),
                                 cell(r.lr), cell(r.grad_norm), r.step_ms, r.throughput, r.throughput_per_gpu, r.unit,
                                 r.mfu < 0 ? "" : fmt::format("{:.4f}", r.mfu), r.elapsed_s,
                                 r.skipped ? "true" : "false", r.loss_scale > 0 ? cell(r.loss_scale) : ""));
  }

  void eval(const EvalRecord& r) override {
    file_.write_line(fmt::format("eval,{},,,,,,,,,,,,{},{},{},{},{}", r.step, cell(r.val_loss), cell(r.best_val_loss),
                                 r.best_step, r.perplexity >= 0 ? cell(r.perplexity) : "",
                                 r.accuracy >= 0 ? cell(r.accuracy) : ""));
  }

 private:
  RecordFile file_;
};

}  // namespace

std::unique_ptr<MetricsSink> make_csv_sink(const std::string& path, int64_t keep_through_step) {
  return std::make_unique<CsvSink>(path, keep_through_step);
}

}  // namespace dpt::train
