#include "metrics_log_tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "tfevents.h"

namespace dpt::train {

namespace {

namespace fs = std::filesystem;

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A name no file in `dir` has: TensorBoard reads a directory's event files in name order, so the name
// starts with the time; a second file of the same process and second gets a counter.
fs::path new_event_file(const fs::path& dir) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const auto seconds = static_cast<int64_t>(wall_time());
  const std::string base =
      fmt::format("events.out.tfevents.{:010d}.{}.{}", seconds, host[0] != '\0' ? host : "localhost", ::getpid());
  fs::path path = dir / base;
  for (int n = 1; fs::exists(path); ++n) path = dir / fmt::format("{}.{}", base, n);
  return path;
}

class TensorBoardSink : public MetricsSink {
 public:
  TensorBoardSink(const std::string& dir, int64_t keep_through_step) {
    const fs::path folder = dir.empty() ? fs::path(".") : fs::path(dir);
    fs::create_directories(folder);
    path_ = new_event_file(folder).string();
    file_ = std::fopen(path_.c_str(), "wb");
    DPT_CHECK(file_ != nullptr, "cannot write the TensorBoard event file '{}': {}", path_, std::strerror(errno));
    const double now = wall_time();
    write(tfevents::file_version_event(now));
    write(tfevents::session_start_event(now, keep_through_step + 1));
  }
  ~TensorBoardSink() override {
    if (file_) std::fclose(file_);
  }
  TensorBoardSink(const TensorBoardSink&) = delete;
  TensorBoardSink& operator=(const TensorBoardSink&) = delete;

  void train(const TrainRecord& r) override {
    std::vector<std::pair<std::string, float>> values = {{"train/loss", static_cast<float>(r.loss)},
                                                         {"train/lr", static_cast<float>(r.lr)},
                                                         {"train/grad_norm", static_cast<float>(r.grad_norm)},
                                                         {"train/throughput", static_cast<float>(r.throughput)},
                                                         {"train/step_ms", static_cast<float>(r.step_ms)}};
    if (r.mfu >= 0) values.emplace_back("train/mfu", static_cast<float>(r.mfu));
    if (r.loss_scale > 0) values.emplace_back("train/loss_scale", static_cast<float>(r.loss_scale));
    write(tfevents::scalars_event(wall_time(), r.step, values));
  }

  void eval(const EvalRecord& r) override {
    std::vector<std::pair<std::string, float>> values = {{"val/loss", static_cast<float>(r.val_loss)}};
    if (r.perplexity >= 0) values.emplace_back("val/perplexity", static_cast<float>(r.perplexity));
    if (r.accuracy >= 0) values.emplace_back("val/accuracy", static_cast<float>(r.accuracy));
    write(tfevents::scalars_event(wall_time(), r.step, values));
  }

 private:
  // One record per event, flushed, so TensorBoard shows a running job's scalars as they come.
  void write(const std::string& event) {
    const std::string bytes = tfevents::record(event);
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size() && std::fflush(file_) == 0;
    DPT_CHECK(ok, "cannot write the TensorBoard event file '{}': {}", path_, std::strerror(errno));
  }

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace

std::unique_ptr<MetricsSink> make_tensorboard_sink(const std::string& dir, int64_t keep_through_step) {
  return std::make_unique<TensorBoardSink>(dir, keep_through_step);
}

}  // namespace dpt::train
