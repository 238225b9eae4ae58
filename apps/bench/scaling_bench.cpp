#include "scaling_bench.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "scaling_model.h"
#include "subcommand.h"

namespace dpt::bench {

namespace {

// GPU counts the step-time model predicts for (table and plot).
constexpr int kModelGpus[] = {1, 2, 4, 8, 16, 64};

struct Args {
  std::string workload = "tiny_gpt";
  int max_gpus = 0;  // 0: every visible GPU
  std::string precision = "bf16";
  int steps = 20;
  int warmup = 5;
  std::vector<double> bucket_sweep = {1, 5, 25, 100};
  double bucket_cap_mb = 25;
  std::string out = "scaling";
  std::string device = "auto";
  std::string train_args;  // appended to every `dpt-bench train` run
};

std::string self_dir() {
  std::array<char, 4096> buf{};
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  DPT_CHECK(n > 0, "dpt-bench scaling: cannot find its own executable");
  return std::filesystem::path(std::string(buf.data(), static_cast<size_t>(n))).parent_path().string();
}

struct Row {
  int gpus = 0;
  double bucket_cap_mb = 0;
  double throughput = 0;  // per GPU
  double step_ms = 0;
  double comm_ms = 0;
  double exposed_ms = 0;
  double grad_bytes = 0;
  std::string unit, device;
};

// The JSON line `dpt-bench train` prints on rank 0: the last line of `output` that is a JSON object
// whose "system" is dptrain's ("dptrain", or "dptrain+graph" with --cuda-graph in --train-args).
nlohmann::json train_result(const std::string& output) {
  nlohmann::json result;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const size_t brace = line.find('{');  // after dpt-run's "[0]: " prefix
    if (brace == std::string::npos) continue;
    nlohmann::json parsed = nlohmann::json::parse(line.substr(brace), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.value("system", "").rfind("dptrain", 0) == 0) result = std::move(parsed);
  }
  return result;
}

double json_number(const nlohmann::json& result, const std::string& key) {
  const auto it = result.find(key);
  DPT_CHECK(it != result.end() && it->is_number(),
            "dpt-bench scaling: '{}' missing from the train benchmark's "
            "output: {}",
            key, result.dump());
  return it->get<double>();
}

Row run_one(const Args& a, int gpus, double bucket_cap_mb) {
  std::string dir = self_dir();
  std::string cmd = dir + "/dpt-run --standalone --nproc-per-node " + std::to_string(gpus) + " -- " + dir +
                    "/dpt-bench train --workload " + a.workload + " --precision " + a.precision + " --steps " +
                    std::to_string(a.steps) + " --warmup " + std::to_string(a.warmup) + " --bucket-cap-mb " +
                    std::to_string(bucket_cap_mb) + " --device " + a.device;
  if (!a.train_args.empty()) cmd += " " + a.train_args;
  cmd += " 2>&1";
  std::FILE* pipe = popen(cmd.c_str(), "r");
  DPT_CHECK(pipe != nullptr, "dpt-bench scaling: cannot run {}", cmd);
  std::string output;
  std::array<char, 8192> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe)) output += buf.data();
  int status = pclose(pipe);
  const nlohmann::json json = train_result(output);
  DPT_CHECK(status == 0 && !json.is_null(), "dpt-bench scaling: {} GPU run failed:\n{}", gpus, output);
  Row r;
  r.gpus = gpus;
  r.bucket_cap_mb = bucket_cap_mb;
  r.throughput = json_number(json, "throughput");
  r.step_ms = json_number(json, "step_ms");
  r.comm_ms = json_number(json, "comm_ms");
  r.exposed_ms = json_number(json, "exposed_comm_ms");
  r.grad_bytes = json_number(json, "grad_bytes");
  r.unit = json.value("unit", "");
  r.device = json.value("device", "");
  const bool graph = json.value("system", "") == "dptrain+graph";
  std::printf("  %d GPU(s), bucket %.0f MB%s: %.0f %s per GPU, step %.2f ms, comm %.2f ms (exposed %.2f)\n", gpus,
              bucket_cap_mb, graph ? " (CUDA graph)" : "", r.throughput, r.unit.c_str(), r.step_ms, r.comm_ms,
              r.exposed_ms);
  std::fflush(stdout);
  return r;
}

// Throughput per GPU and efficiency against the GPU count at the default bucket size (lines: the CSV's
// first `curve_rows` rows), the sweep's runs at the largest count (points: the rows after them), and the
// step-time model's predicted efficiency out to 64 GPUs (dashed), on a log-2 GPU axis.
void write_plot(const std::string& out, const std::string& csv, const std::string& title, double default_cap,
                size_t curve_rows, const ScalingModel& model) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::printf("gnuplot not installed: no PNG plot (apt-get install gnuplot-nox)\n");
    return;
  }
  const std::string script = out + "/scaling.gp";
  const std::string curve = fmt::format("every ::1::{} ", curve_rows), sweep = fmt::format("every ::{} ", curve_rows + 1);
  std::ofstream gp(script);
  gp << "$model << EOD\n";
  for (int g : kModelGpus) gp << g << ',' << 100.0 * model.efficiency(g) << '\n';
  gp << "EOD\n"
     << "set terminal pngcairo size 900,500 noenhanced\nset output '" << out << "/scaling.png'\n"
     << "set datafile separator ','\nset title '" << title << "'\nset xlabel 'GPUs'\nset logscale x 2\n"
     << "set ylabel 'throughput per GPU'\nset y2label 'efficiency (%)'\nset y2range [0:105]\nset ytics nomirror\n"
     << "set y2tics\nset key below\n"
     << "plot '" << csv << "' " << curve << "using 1:3 with linespoints title "
     << fmt::format("'throughput per GPU ({} MB buckets)', ", default_cap)
     << "'' " << curve << "using 1:6 axes x1y2 with linespoints title 'efficiency', "
     << "'' " << sweep << "using 1:6 axes x1y2 with points title 'efficiency, bucket sweep', "
     << "$model using 1:2 axes x1y2 with linespoints dashtype 2 title 'efficiency predicted by the step-time model'\n";
  gp.close();
  if (std::system(("gnuplot '" + script + "'").c_str()) == 0) std::printf("plot: %s/scaling.png\n", out.c_str());
}

int run_scaling_bench(Args a) {
  int available = cuda::is_available() ? cuda::device_count() : 0;
  int max_gpus = a.max_gpus > 0 ? a.max_gpus : std::max(available, 1);
  if (a.device == "auto" && available == 0) a.device = "cpu";
  std::filesystem::create_directories(a.out);
  std::printf("dpt-bench scaling: %s, %s, weak scaling (fixed per-GPU batch), 1..%d processes\n", a.workload.c_str(),
              a.precision.c_str(), max_gpus);

  // 1. Weak scaling at the default bucket size.
  std::vector<Row> rows;
  for (int n = 1; n <= max_gpus; n *= 2) rows.push_back(run_one(a, n, a.bucket_cap_mb));
  if (rows.back().gpus != max_gpus) rows.push_back(run_one(a, max_gpus, a.bucket_cap_mb));
  // 2. Bucket-size sweep at the largest count.
  std::vector<Row> sweep;
  if (max_gpus > 1) {
    for (double cap : a.bucket_sweep) sweep.push_back(run_one(a, max_gpus, cap));
  }

  const Row& base = rows.front();
  double compute_ms = base.step_ms;
  std::string csv = a.out + "/scaling.csv";
  std::ofstream c(csv);
  c << "gpus,bucket_cap_mb,throughput_per_gpu,total_throughput,speedup,efficiency_pct,step_ms,compute_ms,comm_ms,"
       "exposed_comm_ms,comm_compute_ratio\n";
  std::ofstream md(a.out + "/scaling.md");
  md << "| GPUs | bucket MB | " << base.unit << " per GPU | total | speedup | efficiency | step ms | compute ms | "
     << "comm ms | exposed ms | comm/compute |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto emit = [&](const Row& r) {
    double total = r.throughput * r.gpus;
    double speedup = total / base.throughput;
    double eff = 100.0 * speedup / r.gpus;
    c << r.gpus << ',' << r.bucket_cap_mb << ',' << r.throughput << ',' << total << ',' << speedup << ',' << eff << ','
      << r.step_ms << ',' << compute_ms << ',' << r.comm_ms << ',' << r.exposed_ms << ',' << r.comm_ms / compute_ms
      << '\n';
    md << fmt::format("| {} | {:.0f} | {:.0f} | {:.0f} | {:.3f} | {:.1f}% | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.3f} |\n",
                      r.gpus, r.bucket_cap_mb, r.throughput, total, speedup, eff, r.step_ms, compute_ms, r.comm_ms,
                      r.exposed_ms, r.comm_ms / compute_ms);
  };
  for (const auto& r : rows) emit(r);
  for (const auto& r : sweep) emit(r);

  // 3. The step-time model, fitted on the largest measured count, checked against it and extrapolated.
  const Row& top = rows.back();
  ScalingModel model = ScalingModel::fit(compute_ms, base.grad_bytes, top.gpus, top.step_ms, top.comm_ms,
                                         top.exposed_ms);
  md << "\nStep-time model (compute + alpha-beta ring AllReduce minus the part hidden behind backward, plus "
        "interference):\n\n";
  if (top.gpus > 1 && top.comm_ms > 0) {
    const std::string beta =
        model.beta_fitted
            ? fmt::format("bus bandwidth {:.0f} GB/s from {:.2f} ms of communication", model.beta_gbps, top.comm_ms)
            : fmt::format(
                  "{:.2f} ms of bucket spans, longer than the step, are no transfer "
                  "time: bus bandwidth assumed {:.0f} GB/s",
                  top.comm_ms, model.beta_gbps);
    md << fmt::format("fitted at {} GPUs: {}, hidden {:.2f} ms, interference {:.2f} ms per step\n\n", top.gpus, beta,
                      model.hidden_ms, model.interference_ms);
  } else {
    md << "(no communication time measured — one GPU, or a CPU run: the model uses its defaults, alpha 5 us, "
          "beta 300 GB/s, nothing hidden)\n\n";
  }
  md << "| GPUs | nodes | predicted step ms | predicted efficiency | measured efficiency |\n|---|---|---|---|---|\n";
  for (int g : kModelGpus) {
    std::string measured = "—";
    for (const auto& r : rows) {
      if (r.gpus == g) measured = fmt::format("{:.1f}%", 100.0 * r.throughput / base.throughput);
    }
    md << fmt::format("| {} | {} | {:.2f} | {:.1f}% | {} |\n", g, (g + model.gpus_per_node - 1) / model.gpus_per_node,
                      model.step_ms(g), 100.0 * model.efficiency(g), measured);
  }
  md.close();
  c.close();
  write_plot(a.out, csv, a.workload + " weak scaling on " + base.device, a.bucket_cap_mb, rows.size(), model);
  std::ifstream in(a.out + "/scaling.md");
  std::printf("\n%s\n", std::string(std::istreambuf_iterator<char>(in), {}).c_str());
  std::printf("wrote %s, %s/scaling.md\n", csv.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

SubcommandRun setup_scaling_bench(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("--workload", a->workload, "what `dpt-bench train` trains: gpt2_124m, mlp_92m, tiny_gpt, mlp_small")
      ->capture_default_str();
  app.add_option("--max-gpus", a->max_gpus, "largest process count (0: every visible GPU)")
      ->check(cli::at_least(0))
      ->capture_default_str();
  app.add_option("--precision", a->precision, "compute precision")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--steps", a->steps, "timed steps per run")->check(cli::at_least(1))->capture_default_str();
  app.add_option("--warmup", a->warmup, "untimed steps before them")->check(cli::at_least(0))->capture_default_str();
  app.add_option("--bucket-sweep", a->bucket_sweep, "bucket sizes (MB) swept at the largest count")
      ->delimiter(',')
      ->check(cli::number_in(1e-3, 1e6))
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", a->bucket_cap_mb, "DDP's bucket size (MB) of the weak-scaling runs")
      ->check(cli::number_in(1e-3, 1e6))
      ->capture_default_str();
  app.add_option("--out", a->out, "folder of scaling.csv, scaling.md and scaling.png")->capture_default_str();
  app.add_option("--device", a->device, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--train-args", a->train_args,
                 "options added to every `dpt-bench train` run; write --train-args=\"--cuda-graph ...\"");
  cli::set_examples(app, {"dpt-bench scaling --workload gpt2_124m --max-gpus 8 --out results/scaling",
                          "dpt-bench scaling --workload mlp_small --device cpu --max-gpus 2 --steps 3 --precision fp32",
                          "dpt-bench scaling --workload tiny_gpt --train-args=\"--cuda-graph --overlap-optimizer\""});
  return [a] { return run_scaling_bench(*a); };
}

DPT_BENCH_SUBCOMMAND(scaling, "weak scaling at 1..N GPUs, bucket sweep, step-time model; CSV, Markdown, PNG",
                     setup_scaling_bench);

}  // namespace dpt::bench
