// The metrics sinks: the TensorBoard event file decoded field by field by a reader written here (its own
// bitwise CRC-32C and protobuf parser), the CSV table byte for byte, resumes, and a failed write that
// stops dpt-train naming the file.
#include "metrics_log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "metrics_log_csv.h"
#include "tfevents.h"
#include "train_test_util.h"

namespace dpt::train {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

// --- an independent reader of event files ---------------------------------------------------------

uint32_t bitwise_crc32c(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

template <class T>
T little_endian(const std::string& bytes, size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}

struct Event {
  double wall_time = 0;
  int64_t step = -1;
  std::string file_version;
  std::map<std::string, float> values;  // the Summary's simple_values by tag
  int session_status = 0;
};

class ProtoReader {
 public:
  explicit ProtoReader(const std::string& bytes) : bytes_(bytes) {}
  bool done() const { return pos_ >= bytes_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(bytes_.at(pos_++));
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  std::string bytes(size_t n) {
    std::string out = bytes_.substr(pos_, n);
    EXPECT_EQ(out.size(), n);
    pos_ += n;
    return out;
  }
  std::string delimited() { return bytes(varint()); }

 private:
  std::string bytes_;
  size_t pos_ = 0;
};

std::pair<std::string, float> parse_value(const std::string& bytes) {
  ProtoReader r(bytes);
  std::pair<std::string, float> out;
  while (!r.done()) {
    const uint64_t key = r.varint();
    if (key == ((1 << 3) | 2)) {
      out.first = r.delimited();
    } else if (key == ((2 << 3) | 5)) {
      out.second = little_endian<float>(r.bytes(4), 0);
    } else {
      ADD_FAILURE() << "unexpected Value field key " << key;
      break;
    }
  }
  return out;
}

Event parse_event(const std::string& bytes) {
  ProtoReader r(bytes);
  Event e;
  while (!r.done()) {
    const uint64_t key = r.varint();
    switch (key) {
      case (1 << 3) | 1:
        e.wall_time = little_endian<double>(r.bytes(8), 0);
        break;
      case (2 << 3) | 0:
        e.step = static_cast<int64_t>(r.varint());
        break;
      case (3 << 3) | 2:
        e.file_version = r.delimited();
        break;
      case (5 << 3) | 2: {
        ProtoReader summary(r.delimited());
        while (!summary.done()) {
          EXPECT_EQ(summary.varint(), (1u << 3) | 2u);  // repeated Value value = 1
          e.values.insert(parse_value(summary.delimited()));
        }
        break;
      }
      case (6 << 3) | 2: {
        ProtoReader log(r.delimited());
        EXPECT_EQ(log.varint(), (1u << 3) | 0u);  // SessionStatus status = 1
        e.session_status = static_cast<int>(log.varint());
        break;
      }
      default:
        ADD_FAILURE() << "unexpected Event field key " << key;
        return e;
    }
  }
  return e;
}

// Every record of an event file, with both CRCs of each checked.
std::vector<Event> read_events(const std::string& path) {
  const std::string file = read_text(path);
  std::vector<Event> events;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_GE(file.size() - at, 16u) << "a truncated record at byte " << at;
    if (file.size() - at < 16) break;
    const auto length = little_endian<uint64_t>(file, at);
    EXPECT_EQ(little_endian<uint32_t>(file, at + 8), masked(bitwise_crc32c(file.substr(at, 8)))) << "at " << at;
    const std::string data = file.substr(at + 12, length);
    EXPECT_EQ(data.size(), length);
    EXPECT_EQ(little_endian<uint32_t>(file, at + 12 + length), masked(bitwise_crc32c(data))) << "at " << at;
    events.push_back(parse_event(data));
    at += 16 + length;
  }
  return events;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

TrainRecord train_record(int64_t step, double loss) {
  TrainRecord r;
  r.step = step;
  r.loss = loss;
  r.lr = 0.001;
  r.grad_norm = 0.75;
  r.step_ms = 12.5;
  r.throughput = 4096;
  r.throughput_per_gpu = 2048;
  r.unit = "tokens/s";
  r.elapsed_s = 1.5;
  return r;
}

LoggingConfig logging_in(const ScratchDir& dir, bool csv, bool tensorboard) {
  LoggingConfig logging;
  logging.metrics_file = dir.file("metrics.jsonl");
  logging.csv = csv;
  logging.tensorboard = tensorboard;
  return logging;
}

// --- tests ----------------------------------------------------------------------------------------

TEST(TfEvents, Crc32cGivesTheStandardCheckValueAndMasksAsTfRecordDoes) {
  const std::string check = "123456789";
  EXPECT_EQ(tfevents::crc32c(check.data(), check.size()), 0xE3069283u);  // CRC-32C's published check value
  EXPECT_EQ(tfevents::masked_crc32c(check.data(), check.size()), masked(0xE3069283u));
  EXPECT_EQ(bitwise_crc32c(check), 0xE3069283u);  // the test's own reader agrees
}

TEST(MetricsTensorBoard, WritesFramedEventsWithTheScalarsOfEachRecord) {
  ScratchDir dir("metrics_tb");
  {
    MetricsLog log(logging_in(dir, false, true), 0, true);
    TrainRecord r = train_record(5, 2.5);
    r.mfu = 0.25;
    log.train(r);
    log.eval(5, 1.25, 1.25, 5);
  }
  const auto files = event_files(dir.path().string());
  ASSERT_EQ(files.size(), 1u);
  const std::vector<Event> events = read_events(files[0]);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].session_status, 1);  // START at the first step: earlier files' steps are dropped
  EXPECT_EQ(events[1].step, 1);
  const Event& train = events[2];
  EXPECT_EQ(train.step, 5);
  EXPECT_GT(train.wall_time, 1.7e9);  // seconds since 1970, a date after 2023
  EXPECT_EQ(train.values, (std::map<std::string, float>{{"train/loss", 2.5f},
                                                        {"train/lr", 0.001f},
                                                        {"train/grad_norm", 0.75f},
                                                        {"train/throughput", 4096.0f},
                                                        {"train/step_ms", 12.5f},
                                                        {"train/mfu", 0.25f}}));
  const Event& eval = events[3];
  EXPECT_EQ(eval.step, 5);
  EXPECT_EQ(eval.values, (std::map<std::string, float>{{"val/loss", 1.25f},
                                                       {"val/perplexity", static_cast<float>(std::exp(1.25))}}));
}

TEST(MetricsTensorBoard, AResumedRunWritesANewFileThatStartsAfterTheCheckpointStep) {
  ScratchDir dir("metrics_tb_resume");
  { MetricsLog(logging_in(dir, false, true), 0, false).train(train_record(1, 3.0)); }
  {
    MetricsLog log(logging_in(dir, false, true), 40, false);
    log.train(train_record(41, 2.0));
    log.eval(41, 2.5, 2.25, 40);
  }
  const auto files = event_files(dir.path().string());
  ASSERT_EQ(files.size(), 2u);
  const std::vector<Event> resumed = read_events(files[1]);
  ASSERT_EQ(resumed.size(), 4u) << files[1];
  EXPECT_EQ(resumed[1].session_status, 1);
  EXPECT_EQ(resumed[1].step, 41);
  EXPECT_EQ(resumed[3].values, (std::map<std::string, float>{{"val/loss", 2.5f}}));  // no perplexity: not a LM
}

TEST(MetricsCsv, WritesOneRowPerRecordUnderTheHeader) {
  ScratchDir dir("metrics_csv");
  {
    MetricsLog log(logging_in(dir, true, false), 0, true);
    log.train(train_record(1, 2.5));
    TrainRecord bad = train_record(2, std::nan(""));
    bad.skipped = true;
    bad.loss_scale = 1024;
    log.train(bad);
    log.eval(2, 0.5, 0.5, 2);
  }
  EXPECT_EQ(read_text(dir.file("metrics.csv")),
            std::string(kMetricsCsvHeader) + "\n" +
                "train,1,2.5,0.001,0.75,12.500,4096.0,2048.0,tokens/s,,1.500,false,,,,,,\n"
                "train,2,nan,0.001,0.75,12.500,4096.0,2048.0,tokens/s,,1.500,true,1024,,,,,\n"
                "eval,2,,,,,,,,,,,," +
                fmt::format("0.5,0.5,2,{},\n", std::exp(0.5)));
  // The JSONL file has the same records, and the perplexity.
  const auto records = read_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(field(records[2].line, "val_perplexity"), fmt::format("{}", std::exp(0.5)));
}

// A classifier's validation accuracy reaches every sink: JSONL val_accuracy, the CSV's last column and
// TensorBoard's val/accuracy.
TEST(MetricsLog, AClassifiersAccuracyReachesEverySink) {
  ScratchDir dir("metrics_accuracy");
  { MetricsLog(logging_in(dir, true, true), 0, false).eval(7, 0.5, 0.5, 7, 0.875); }
  const auto records = read_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(field(records[0].line, "val_accuracy"), "0.875");
  EXPECT_TRUE(field(records[0].line, "val_perplexity").empty());
  EXPECT_EQ(read_text(dir.file("metrics.csv")),
            std::string(kMetricsCsvHeader) + "\neval,7,,,,,,,,,,,,0.5,0.5,7,,0.875\n");
  const auto files = event_files(dir.path().string());
  ASSERT_EQ(files.size(), 1u);
  const std::vector<Event> events = read_events(files[0]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().values, (std::map<std::string, float>{{"val/loss", 0.5f}, {"val/accuracy", 0.875f}}));
}

TEST(MetricsCsv, AResumeKeepsTheRowsUpToTheCheckpointStepAndOneHeader) {
  ScratchDir dir("metrics_csv_resume");
  {
    MetricsLog log(logging_in(dir, true, false), 0, false);
    for (int step = 1; step <= 6; ++step) log.train(train_record(step, 1.0 / step));
    log.eval(3, 0.9, 0.9, 3);
  }
  { MetricsLog(logging_in(dir, true, false), 4, false).train(train_record(5, 0.125)); }
  const std::string csv = read_text(dir.file("metrics.csv"));
  std::vector<std::string> rows;
  std::istringstream lines(csv);
  for (std::string line; std::getline(lines, line);) rows.push_back(line.substr(0, line.find(',', 6)));
  EXPECT_EQ(rows,
            (std::vector<std::string>{"type,step", "train,1", "train,2", "train,3", "train,4", "eval,3", "train,5"}));
  EXPECT_NE(csv.find("train,5,0.125,"), std::string::npos) << csv;
}

TEST(MetricsJsonl, AResumeDropsALineThatIsNotJsonWithAWarningNamingTheFile) {
  ScratchDir dir("metrics_jsonl_malformed");
  {
    MetricsLog log(logging_in(dir, false, false), 0, false);
    for (int step = 1; step <= 3; ++step) log.train(train_record(step, 1.0 / step));
  }
  // The half-written last line of a run that was killed, and a line that is not JSON at all.
  std::ofstream(dir.file("metrics.jsonl"), std::ios::app) << "{\"type\": \"train\", \"step\": 4, \"lo\nnot json\n";
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(8);
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("metrics_test", sink));
  { MetricsLog(logging_in(dir, false, false), 3, false).train(train_record(4, 0.25)); }
  spdlog::set_default_logger(previous);
  const auto records = read_metrics(dir.file("metrics.jsonl"));
  ASSERT_EQ(records.size(), 4u) << read_text(dir.file("metrics.jsonl"));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(records[static_cast<size_t>(i)].step, i + 1);
  EXPECT_EQ(records[3].loss, "0.25");
  const std::vector<std::string> warnings = sink->last_formatted();
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("metrics file '" + dir.file("metrics.jsonl") + "'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("not json"), std::string::npos) << warnings[1];
}

TEST(MetricsJsonl, RecordsAreJsonObjectsInTheLayoutPlotMetricsReads) {
  ScratchDir dir("metrics_jsonl_layout");
  {
    MetricsLog log(logging_in(dir, false, false), 0, true);
    TrainRecord r = train_record(1, std::nan(""));
    r.unit = "tokens/s \"quoted\"";
    log.train(r);
    log.eval(1, 0.5, 0.5, 1);
  }
  std::ifstream in(dir.file("metrics.jsonl"));
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) {
    // scripts/plot-metrics.sh finds the type and the step by this prefix.
    EXPECT_EQ(line.rfind("{\"type\": \"", 0), 0u) << line;
    EXPECT_NE(line.find("\", \"step\": 1, "), std::string::npos) << line;
    records.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(records.size(), 2u);
  EXPECT_TRUE(records[0]["loss"].is_null()) << "a non-finite loss is null";
  EXPECT_EQ(records[0]["unit"], "tokens/s \"quoted\"");
  EXPECT_FALSE(records[0]["skipped"].get<bool>());
  EXPECT_DOUBLE_EQ(records[1]["val_perplexity"].get<double>(), std::exp(0.5));
}

TEST(MetricsLog, AFailedWriteThrowsNamingTheFile) {
  LoggingConfig logging;
  logging.metrics_file = "/dev/full";
  MetricsLog log(logging, 0, false);
  try {
    log.train(train_record(1, 1.0));
    ADD_FAILURE() << "a write to /dev/full succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("'/dev/full'"), std::string::npos) << e.what();
  }
}

TEST(TrainMetrics, AMetricsFileThatCannotBeWrittenStopsTheRunWithAnError) {
  ScratchDir dir("metrics_full");
  RunResult r =
      train(config_path("mlp_synthetic.yaml"), {"training.steps=3", "schedule.warmup_steps=0", "training.device=cpu",
                                                "checkpoint.dir=" + dir.file("run"), "logging.metrics_file=/dev/full"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot write the metrics file '/dev/full'"), std::string::npos) << r.output;
}

TEST(TrainMetrics, CsvAndTensorBoardLogsHoldEveryRecordAndPerplexityForLanguageModels) {
  ScratchDir dir("metrics_train");
  const std::string run = dir.file("run");
  RunResult r = train(config_path("char_gpt.yaml"),
                      {"training.steps=4", "schedule.warmup_steps=0", "checkpoint.dir=" + run, "model.gpt.n_layer=1",
                       "model.gpt.n_embd=32", "data.seq_len=32", "eval.sample_tokens=0", "eval.every=2",
                       "logging.every=1", "logging.csv=true", "logging.tensorboard=true"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto records = read_metrics(run + "/metrics.jsonl");
  ASSERT_EQ(train_records(records).size(), 4u);
  const auto evals = eval_records(records);
  ASSERT_EQ(evals.size(), 2u);  // steps 2 and 4
  for (const auto& e : evals)
    EXPECT_DOUBLE_EQ(number(field(e.line, "val_perplexity")), std::exp(number(e.val_loss))) << e.line;
  std::istringstream csv(read_text(run + "/metrics.csv"));
  std::vector<std::string> rows;
  for (std::string line; std::getline(csv, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), 1u + records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(rows[i + 1].substr(0, rows[i + 1].find(',', 6)), records[i].type + "," + std::to_string(records[i].step));
  }
  const auto files = event_files(run);
  ASSERT_EQ(files.size(), 1u);
  const std::vector<Event> events = read_events(files[0]);
  ASSERT_EQ(events.size(), 2u + records.size());
  EXPECT_EQ(events[2].values.at("train/loss"), static_cast<float>(number(train_records(records)[0].loss)));
  EXPECT_EQ(events.back().values.at("val/perplexity"), static_cast<float>(std::exp(number(evals.back().val_loss))));
}

TEST(TrainMetrics, AnMlpReportsNoPerplexity) {
  ScratchDir dir("metrics_mlp");
  RunResult r = train(config_path("mlp_synthetic.yaml"), {"training.steps=3", "schedule.warmup_steps=0",
                                                          "training.device=cpu", "checkpoint.dir=" + dir.file("run")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto evals = eval_records(read_metrics(dir.file("run/metrics.jsonl")));
  ASSERT_FALSE(evals.empty());
  EXPECT_EQ(evals.back().line.find("perplexity"), std::string::npos) << evals.back().line;
}

}  // namespace
}  // namespace dpt::train
