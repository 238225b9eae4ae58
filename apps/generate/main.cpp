// dpt-generate: samples text from a GPT that dpt-train trained, from its run directory.
//   dpt-generate runs/char_gpt --prompt "The keeper" --max-tokens 200 --temperature 0.8 --top-k 40 --seed 1
// Reads the run's config.yaml and its newest valid checkpoint (or --step N), builds the model as the
// trainer does, and prints the prompt followed by the sampled text on stdout (logs go to stderr). The
// same run, prompt, options and seed print the same text; --top-k 1 or --temperature 0 is greedy.
// Exit codes: 0 done; 1 error (one message on stderr); 2 usage.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <optional>
#include <string>

#include "command_line.h"
#include "core/error.h"
#include "data/gpt2_bpe.h"
#include "text_codec.h"
#include "text_sample.h"
#include "trained_run.h"

namespace {

struct Options {
  std::string run;
  int64_t step = -1;  // < 0: the newest valid checkpoint
  std::string prompt;
  int64_t max_tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 0;
  uint64_t seed = 0;
  std::string device = "auto";
  std::string tokenizer = "auto";
  std::string tokenizer_dir = dpt::data::Gpt2Tokenizer::default_dir();
};

int generate(const Options& o) {
  using namespace dpt::train;
  const dpt::Device device = choose_device(o.device);
  std::unique_ptr<TrainedRun> run =
      open_trained_run(o.run, o.step >= 0 ? std::optional<int64_t>(o.step) : std::nullopt, device);
  std::unique_ptr<TextCodec> codec = make_text_codec(o.tokenizer, *run, o.tokenizer_dir);
  spdlog::info("{} at step {}: {}; tokens: {}; on {}", run->checkpoint_path, run->step, run->model->description(),
               codec->describe(), device.str());
  std::vector<int32_t> prompt;
  try {
    prompt = codec->encode(o.prompt);
  } catch (const std::exception& e) {
    DPT_FAIL("--prompt: {}", e.what());
  }
  for (int32_t id : prompt) {
    DPT_CHECK(id < run->vocab_size(),
              "the prompt's token {} ('{}') is outside the model's vocabulary of {} (its training data had no higher "
              "id)",
              id, codec->decode({id}), run->vocab_size());
  }
  if (prompt.empty()) prompt.push_back(codec->start_token());
  SamplingOptions sampling;
  sampling.temperature = o.temperature;
  sampling.top_k = o.top_k;
  sampling.vocab_limit = std::min(codec->vocab_size(), run->vocab_size());
  CachedGpt model(run->gpt());
  const std::vector<int32_t> ids = dpt::train::generate(model, prompt, o.max_tokens, sampling, o.seed);
  const std::string text = codec->continued(o.prompt, ids) + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  DPT_CHECK(!std::ferror(stdout), "cannot write the text to stdout");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Samples text from a GPT trained by dpt-train", "dpt-generate"};
  app.add_option("run", o.run, "run directory (checkpoint.dir of the run), or one step_N directory in it")->required();
  app.add_option("--step", o.step, "checkpoint step to load (default: the newest valid one)")
      ->check(dpt::cli::at_least(0));
  app.add_option("--prompt,-p", o.prompt, "text to continue (default: none, start from the start token)");
  app.add_option("--max-tokens,-n", o.max_tokens, "tokens to sample")
      ->check(dpt::cli::at_least(0))
      ->capture_default_str();
  app.add_option("--temperature,-t", o.temperature, "softmax temperature; 0 is greedy")
      ->check(dpt::cli::at_least(0))
      ->capture_default_str();
  app.add_option("--top-k,-k", o.top_k, "sample among the k most likely tokens; 0: all; 1: greedy")
      ->check(dpt::cli::at_least(0))
      ->capture_default_str();
  app.add_option("--seed,-s", o.seed, "random seed of the draws")->check(dpt::cli::at_least(0))->capture_default_str();
  app.add_option("--device,-d", o.device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--tokenizer", o.tokenizer, "auto (from the run's data) | char | gpt2 | ids")
      ->check(CLI::IsMember({"auto", "char", "gpt2", "ids"}))
      ->capture_default_str();
  app.add_option("--tokenizer-dir", o.tokenizer_dir, "folder of GPT-2's encoder.json and vocab.bpe")
      ->capture_default_str();
  dpt::cli::set_examples(app, {"dpt-generate runs/char_gpt --prompt \"The keeper\" --max-tokens 200",
                               "dpt-generate runs/gpt2 --step 5000 -p \"Once upon\" -t 0.8 -k 40 --seed 1"});
  if (auto code = dpt::cli::parse(app, argc, argv)) return *code;
  // stdout carries only the text, so it can be piped; logs go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_st("dpt-generate"));
  spdlog::set_pattern("[%H:%M:%S] %^%v%$");
  try {
    return generate(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpt-generate: error: %s\n", e.what());
    return 1;
  }
}
