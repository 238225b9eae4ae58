#include "multirun.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "config.h"
#include "core/error.h"

extern char** environ;

namespace dpt::train {

namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Runs `args` (args[0] a path) and waits for it: its exit code, or 128 + the signal that ended it.
int run_child(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  DPT_CHECK(rc == 0, "cannot start {}: {}", args[0], std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) DPT_CHECK(errno == EINTR, "waitpid failed: {}", std::strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A number of the summary: empty when there is none (NaN), else as written in the metrics.
std::string cell(double v, const char* format) {
  return std::isnan(v) ? std::string() : fmt::format(fmt::runtime(format), v);
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_summaries(const fs::path& dir, const std::vector<SweepDimension>& dimensions,
                     const std::vector<RunSummary>& runs) {
  std::ofstream csv(dir / "summary.csv"), md(dir / "summary.md");
  csv << "run";
  md << "| run |";
  for (const auto& d : dimensions) {
    csv << ',' << csv_field(d.key);
    md << ' ' << d.key << " |";
  }
  csv << ",exit_code,final_val_loss,best_val_loss,throughput,unit\n";
  md << " exit code | final val loss | best val loss | throughput |\n|---|";
  for (size_t i = 0; i < dimensions.size(); ++i) md << "---|";
  md << "---|---|---|---|\n";
  for (const auto& r : runs) {
    csv << csv_field(r.name);
    md << "| " << r.name << " |";
    for (const auto& override_text : r.combination) {
      const std::string value = override_text.substr(override_text.find('=') + 1);
      csv << ',' << csv_field(value);
      md << ' ' << value << " |";
    }
    csv << ',' << r.exit_code << ',' << cell(r.final_val_loss, "{}") << ',' << cell(r.best_val_loss, "{}") << ','
        << cell(r.throughput, "{}") << ',' << csv_field(r.unit) << '\n';
    md << ' ' << r.exit_code << " | " << cell(r.final_val_loss, "{:.4f}") << " | " << cell(r.best_val_loss, "{:.4f}")
       << " | " << cell(r.throughput, "{:.1f}") << (r.unit.empty() ? "" : " " + r.unit) << " |\n";
  }
  DPT_CHECK(csv.good() && md.good(), "cannot write the multirun summaries in '{}'", dir.string());
}

}  // namespace

SweepDimension parse_sweep(const std::string& override_text) {
  const size_t eq = override_text.find('=');
  DPT_CHECK(eq != std::string::npos && eq > 0, "--multirun: '{}' is not an override key=value", override_text);
  SweepDimension d;
  d.key = override_text.substr(0, eq);
  int depth = 0;
  char quote = 0;
  std::string choice;
  for (char c : override_text.substr(eq + 1)) {
    if (quote != 0) {
      quote = c == quote ? 0 : quote;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == ',' && depth == 0) {
      d.choices.push_back(choice);
      choice.clear();
      continue;
    }
    choice += c;
  }
  d.choices.push_back(choice);
  for (const auto& c : d.choices)
    DPT_CHECK(!c.empty(), "--multirun: '{}' has an empty choice (key=a,b,c)", override_text);
  return d;
}

std::vector<std::vector<std::string>> sweep_combinations(const std::vector<SweepDimension>& dimensions) {
  std::vector<std::vector<std::string>> out = {{}};
  for (const auto& d : dimensions) {
    std::vector<std::vector<std::string>> next;
    for (const auto& partial : out) {
      for (const auto& choice : d.choices) {
        next.push_back(partial);
        next.back().push_back(d.key + "=" + choice);
      }
    }
    out = std::move(next);
  }
  return out;
}

std::string run_name(const std::vector<std::string>& combination) {
  std::string name;
  for (const auto& override_text : combination) {
    if (!name.empty()) name += "__";
    std::string part = override_text;
    part.erase(0, part.find_first_not_of('+'));  // +key and ++key name the same key
    std::replace(part.begin(), part.end(), '=', '_');
    for (char& c : part)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '+' && c != '-') c = '_';
    name += part;
  }
  return name;
}

RunSummary summarize_run(const std::string& metrics_file) {
  std::ifstream in(metrics_file);
  DPT_CHECK(in.good(), "cannot read the metrics file '{}'", metrics_file);
  RunSummary s;
  s.final_val_loss = s.best_val_loss = kNaN;
  std::vector<double> throughputs;
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    DPT_CHECK(record.is_object(), "{}:{}: not a JSON record: {}", metrics_file, line_number, line.substr(0, 200));
    const std::string type = record.value("type", "");
    auto number = [&](const char* key) {
      const auto it = record.find(key);
      return it != record.end() && it->is_number() ? it->get<double>() : kNaN;
    };
    if (type == "eval") {
      s.final_val_loss = number("val_loss");
      s.best_val_loss = number("best_val_loss");
    } else if (type == "train") {
      if (const double t = number("throughput"); !std::isnan(t)) throughputs.push_back(t);
      s.unit = record.value("unit", s.unit);
    }
  }
  s.throughput = median(throughputs);
  return s;
}

int multirun(const std::string& program, const std::string& config_path, const std::vector<std::string>& overrides) {
  const char* world = std::getenv("WORLD_SIZE");
  DPT_CHECK(world == nullptr || std::string(world) == "1",
            "--multirun starts its runs one after another as child processes: run it without dpt-run (WORLD_SIZE "
            "is {})",
            world != nullptr ? world : "");
  std::vector<std::string> fixed;
  std::vector<SweepDimension> dimensions;
  for (const auto& o : overrides) {
    SweepDimension d = parse_sweep(o);
    if (d.choices.size() > 1) {
      DPT_CHECK(
          d.key.find("checkpoint.dir") == std::string::npos && d.key.find("logging.metrics_file") == std::string::npos,
          "--multirun chooses each run's checkpoint.dir and metrics file itself; '{}' cannot be swept", d.key);
      dimensions.push_back(std::move(d));
    } else {
      fixed.push_back(o);
    }
  }
  DPT_CHECK(!dimensions.empty(), "--multirun needs an override with several values, such as optim.lr=0.01,0.003");
  const auto combinations = sweep_combinations(dimensions);

  // Every combination is a valid config before the first run starts.
  std::vector<std::string> first = fixed;
  first.insert(first.end(), combinations.front().begin(), combinations.front().end());
  const fs::path dir = fs::path(load_config(config_path, first).checkpoint.dir) / "multirun";
  for (const auto& combination : combinations) {
    std::vector<std::string> all = fixed;
    all.insert(all.end(), combination.begin(), combination.end());
    load_config(config_path, all);
  }
  fs::create_directories(dir);

  std::vector<RunSummary> runs;
  int failed = 0;
  for (size_t i = 0; i < combinations.size(); ++i) {
    const std::string name = run_name(combinations[i]);
    const fs::path run_dir = dir / name;
    std::vector<std::string> args = {program, "--config", config_path};
    for (const auto& o : fixed) args.insert(args.end(), {"--set", o});
    for (const auto& o : combinations[i]) args.insert(args.end(), {"--set", o});
    args.insert(args.end(), {"--set", "checkpoint.dir=" + run_dir.string(), "--set",
                             "logging.metrics_file=" + (run_dir / "metrics.jsonl").string()});
    std::printf("dpt-train --multirun: run %zu of %zu: %s\n", i + 1, combinations.size(), run_dir.c_str());
    std::fflush(stdout);
    const int code = run_child(args);
    RunSummary summary;
    try {
      summary = summarize_run((run_dir / "metrics.jsonl").string());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dpt-train --multirun: %s: no summary: %s\n", name.c_str(), e.what());
      summary.final_val_loss = summary.best_val_loss = summary.throughput = kNaN;
    }
    summary.name = name;
    summary.combination = combinations[i];
    summary.exit_code = code;
    runs.push_back(std::move(summary));
    failed += code != 0;
    if (code > 128) {  // stopped by a signal (Ctrl-C): the sweep stops with it
      write_summaries(dir, dimensions, runs);
      return code;
    }
  }
  write_summaries(dir, dimensions, runs);
  std::ifstream md(dir / "summary.md");
  std::printf("\n%s\nwrote %s and %s\n", std::string(std::istreambuf_iterator<char>(md), {}).c_str(),
              (dir / "summary.md").c_str(), (dir / "summary.csv").c_str());
  if (failed > 0) std::fprintf(stderr, "dpt-train --multirun: %d of %zu runs failed\n", failed, runs.size());
  return failed > 0 ? 1 : 0;
}

}  // namespace dpt::train
