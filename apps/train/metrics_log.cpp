#include "metrics_log.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "json_line.h"
#include "metrics_log_csv.h"
#include "metrics_log_tensorboard.h"

namespace dpt::train {

namespace fs = std::filesystem;

namespace {

// A number rounded to `decimals` places, for fields whose digits beyond that are noise (times, rates).
double rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

// The "step" of a JSONL record; -1 for a record without one (kept on resume). A line that is not a JSON
// object (the half-written last line of a run that was killed) gives INT64_MAX: it is dropped, with a
// warning naming the file.
int64_t step_of(const std::string& path, const std::string& line) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object()) {
    spdlog::warn("metrics file '{}': dropping a line that is not a JSON record: {}", path, line.substr(0, 200));
    return std::numeric_limits<int64_t>::max();
  }
  const auto step = record.find("step");
  return step != record.end() && step->is_number_integer() ? step->get<int64_t>() : -1;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

RecordFile::RecordFile(std::string path, int64_t keep_through_step,
                       const std::function<int64_t(const std::string&)>& step_of, const std::string& header)
    : path_(std::move(path)) {
  const fs::path p(path_);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::string kept = header.empty() ? "" : header + "\n";
  // Only a regular file is read back: a device such as /dev/full would never end.
  if (keep_through_step > 0 && fs::is_regular_file(p)) {
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line != header && step_of(line) <= keep_through_step) kept += line + "\n";
    }
  }
  // Opening a FIFO for writing would wait for a reader, for good.
  DPT_CHECK(!fs::is_fifo(p), "the metrics file '{}' is a FIFO: metrics go to a regular file (or /dev/null)", path_);
  file_ = std::fopen(path_.c_str(), "w");
  DPT_CHECK(file_ != nullptr, "cannot write the metrics file '{}': {}", path_, std::strerror(errno));
  if (!kept.empty()) write_line(kept.substr(0, kept.size() - 1));
}

RecordFile::~RecordFile() {
  if (file_) std::fclose(file_);
}

void RecordFile::write_line(const std::string& line) {
  const bool ok = std::fputs(line.c_str(), file_) >= 0 && std::fputc('\n', file_) != EOF && std::fflush(file_) == 0;
  DPT_CHECK(ok, "cannot write the metrics file '{}': {}", path_, std::strerror(errno));
}

namespace {

class JsonlSink : public MetricsSink {
 public:
  JsonlSink(const std::string& path, int64_t keep_through_step)
      : file_(path, keep_through_step, [path](const std::string& line) { return step_of(path, line); }) {}

  void train(const TrainRecord& r) override {
    nlohmann::ordered_json record = {
        {"type", "train"},
        {"step", r.step},
        {"loss", r.loss},
        {"lr", r.lr},
        {"grad_norm", r.grad_norm},
        {"step_ms", rounded(r.step_ms, 3)},
        {"throughput", rounded(r.throughput, 1)},
        {"throughput_per_gpu", rounded(r.throughput_per_gpu, 1)},
        {"unit", r.unit},
        {"mfu", r.mfu < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(rounded(r.mfu, 4))},
        {"elapsed_s", rounded(r.elapsed_s, 3)},
        {"skipped", r.skipped}};
    if (r.loss_scale > 0) record["loss_scale"] = r.loss_scale;
    file_.write_line(json_line(record));
  }

  void eval(const EvalRecord& r) override {
    nlohmann::ordered_json record = {{"type", "eval"},
                                     {"step", r.step},
                                     {"val_loss", r.val_loss},
                                     {"best_val_loss", r.best_val_loss},
                                     {"best_step", r.best_step}};
    if (r.perplexity >= 0) record["val_perplexity"] = r.perplexity;
    if (r.accuracy >= 0) record["val_accuracy"] = r.accuracy;
    file_.write_line(json_line(record));
  }

 private:
  RecordFile file_;
};

}  // namespace

MetricsLog::MetricsLog(const LoggingConfig& logging, int64_t keep_through_step, bool language_model)
    : language_model_(language_model) {
  sinks_.push_back(std::make_unique<JsonlSink>(logging.metrics_file, keep_through_step));
  const fs::path dir = fs::path(logging.metrics_file).parent_path();
  if (logging.csv) sinks_.push_back(make_csv_sink((dir / "metrics.csv").string(), keep_through_step));
  if (logging.tensorboard) sinks_.push_back(make_tensorboard_sink(dir.string(), keep_through_step));
}

void MetricsLog::train(const TrainRecord& r) {
  for (auto& sink : sinks_) sink->train(r);
}

void MetricsLog::eval(int64_t step, double val_loss, double best_val_loss, int64_t best_step, double accuracy) {
  EvalRecord r;
  r.step = step;
  r.val_loss = val_loss;
  r.best_val_loss = best_val_loss;
  r.best_step = best_step;
  if (language_model_) r.perplexity = std::exp(val_loss);
  r.accuracy = accuracy;
  for (auto& sink : sinks_) sink->eval(r);
}

std::string human_count(double v) {
  if (v >= 1e9) return fmt::format("{:.2f}G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f}k", v / 1e3);
  return fmt::format("{:.1f}", v);
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<int64_t>(std::llround(s));
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
  if (total >= 60) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}s", total);
}

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

ProgressBar::ProgressBar(bool enabled, int64_t total) : enabled_(enabled), total_(total) {}

void ProgressBar::update(int64_t step, double loss) {
  if (!enabled_) return;
  const double now = now_seconds();
  if (step != total_ && now - last_draw_ < 0.1) return;  // at most ten redraws a second
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * step / total_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), ' ');
  std::fprintf(stdout, "\r[%s] %lld/%lld  loss %.4f\033[K", bar.c_str(), static_cast<long long>(step),
               static_cast<long long>(total_), loss);
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!enabled_ || !drawn_) return;
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
  drawn_ = false;
}

void ProgressBar::finish() { clear(); }

}  // namespace dpt::train
