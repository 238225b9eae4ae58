// dpt-export-hf: writes a GPT that dpt-train trained as a Hugging Face GPT-2 folder.
//   dpt-export-hf runs/gpt2_124m hf/gpt2_124m [--step N] [--vocab-size 50257] [--eval-tokens val.bin]
// The folder (config.json + model.safetensors, apps/train/hf_gpt2.h) loads with
// transformers.GPT2LMHeadModel.from_pretrained, and model.init_from reads it back. --eval-tokens prints
// the model's loss on the first block_size tokens of a .bin token file ("loss <value>" on stdout), the
// number scripts/check-hf-export.py compares with transformers' loss on the same tokens.
// Exit codes: 0 done; 1 error (one message on stderr); 2 usage.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <optional>
#include <string>

#include "command_line.h"
#include "core/error.h"
#include "data/token_file.h"
#include "hf_gpt2.h"
#include "trained_run.h"

namespace {

// llm.c and nanoGPT pad GPT-2's 50257 tokens to 50304 rows; the rows past the tokenizer's are unused.
constexpr int64_t kPaddedGpt2Vocab = 50304;
constexpr int64_t kGpt2Vocab = 50257;

struct Options {
  std::string run;
  std::string out;
  int64_t step = -1;        // < 0: the newest valid checkpoint
  int64_t vocab_size = 0;   // 0: the model's rows (50304 -> 50257)
  std::string eval_tokens;  // a .bin token file to score
  bool force = false;
};

int export_run(const Options& o) {
  using namespace dpt::train;
  std::unique_ptr<TrainedRun> run =
      open_trained_run(o.run, o.step >= 0 ? std::optional<int64_t>(o.step) : std::nullopt, dpt::Device::cpu());
  const int64_t rows = run->vocab_size();
  const int64_t vocab = o.vocab_size > 0 ? o.vocab_size : rows == kPaddedGpt2Vocab ? kGpt2Vocab : rows;
  DPT_CHECK(vocab <= rows, "--vocab-size {}: the model has only {} embedding rows", vocab, rows);
  export_hf_gpt2(run->gpt(), vocab, o.out, o.force);
  spdlog::info("{} at step {}: {} -> {} (vocabulary {})", run->checkpoint_path, run->step, run->model->description(),
               o.out, vocab);
  if (!o.eval_tokens.empty()) {
    const dpt::data::TokenFile file(o.eval_tokens);
    std::vector<int32_t> tokens(file.tokens(), file.tokens() + file.size());
    const double loss = gpt_sequence_loss(run->gpt(), tokens, vocab);
    std::printf("loss %.9g\n", loss);
    std::fflush(stdout);
    DPT_CHECK(!std::ferror(stdout), "cannot write the loss to stdout");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Exports a GPT trained by dpt-train as a Hugging Face GPT-2 folder", "dpt-export-hf"};
  app.add_option("run", o.run, "run directory (checkpoint.dir of the run), or one step_N directory in it")->required();
  app.add_option("out", o.out, "folder to write config.json and model.safetensors into")->required();
  app.add_option("--step", o.step, "checkpoint step to export (default: the newest valid one)")
      ->check(dpt::cli::at_least(0));
  app.add_option("--vocab-size", o.vocab_size, "embedding rows to keep (default: all, but 50257 of a padded 50304)")
      ->check(dpt::cli::at_least(1));
  app.add_option("--eval-tokens", o.eval_tokens,
                 "a .bin token file: print the model's loss on its first block_size tokens")
      ->check(CLI::ExistingFile);
  app.add_flag("--force", o.force, "replace config.json and model.safetensors in the output folder");
  dpt::cli::set_examples(app,
                         {"dpt-export-hf runs/gpt2 hf/gpt2", "dpt-export-hf runs/gpt2 hf/gpt2 --step 5000 --force"});
  if (auto code = dpt::cli::parse(app, argc, argv)) return *code;
  // stdout carries only the loss, so it can be parsed; logs go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_st("dpt-export-hf"));
  spdlog::set_pattern("[%H:%M:%S] %^%v%$");
  try {
    return export_run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpt-export-hf: error: %s\n", e.what());
    return 1;
  }
}
