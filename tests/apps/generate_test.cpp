// dpt-generate as a user runs it: a tiny GPT trained for a few steps by dpt-train, then sampled from its
// run directory. The text is a pure function of (checkpoint, prompt, options, seed).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "data/char_text.h"
#include "optim/checkpoint.h"
#include "train_test_util.h"
#include "vocab_metadata.h"

namespace dpt::train {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

const std::string kStory = std::string(DPT_SOURCE_DIR) + "/data/corpus/tiny.txt";

// A one-layer character GPT on `text`, 6 steps, checkpoints at steps 3 and 6 in `dir`.
void train_char_gpt(const std::string& dir, const std::string& text = kStory) {
  RunResult r = train(config_path("char_gpt.yaml"),
                      {"training.steps=6", "schedule.warmup_steps=0", "checkpoint.dir=" + dir, "checkpoint.every=3",
                       "model.gpt.n_layer=1", "model.gpt.n_embd=32", "data.seq_len=32", "data.path=" + text,
                       "eval.sample_tokens=0", "logging.progress_bar=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

struct Generated {
  int exit_code = -1;
  std::string text;  // stdout
  std::string log;   // stderr
};

Generated generate(const ScratchDir& scratch, const std::string& args) {
  const std::string out = scratch.file("stdout.txt");
  // run_shell sends stderr to its pipe; the braces keep that from following stdout into the file.
  RunResult r = run_shell("{ " + bin("dpt-generate") + " " + args + " >" + quote(out) + "; }");
  return {r.exit_code, read_text(out), r.output};
}

std::string prompt_args(const std::string& run, const std::string& prompt, int tokens, const std::string& more) {
  return quote(run) + " --prompt " + quote(prompt) + " --max-tokens " + std::to_string(tokens) + " " + more;
}

TEST(Generate, PrintsThePromptThenTheRequestedNumberOfVocabularyCharacters) {
  ScratchDir scratch("generate_text");
  const std::string run = scratch.file("run");
  train_char_gpt(run);
  Generated g = generate(scratch, prompt_args(run, "The keeper", 40, "--seed 1"));
  ASSERT_EQ(g.exit_code, 0) << g.log;
  ASSERT_EQ(g.text.size(), std::string("The keeper").size() + 40 + 1) << g.text;  // one newline after the text
  EXPECT_EQ(g.text.substr(0, 10), "The keeper");
  EXPECT_EQ(g.text.back(), '\n');
  const std::string vocab = data::CharVocab(read_text(kStory)).chars();
  for (char c : g.text.substr(10, 40)) EXPECT_NE(vocab.find(c), std::string::npos) << "byte " << int(c);
  EXPECT_NE(g.log.find("at step 6"), std::string::npos) << g.log;  // the newest checkpoint
}

TEST(Generate, TheSameSeedGivesTheSameTextAndAnotherSeedAnotherText) {
  ScratchDir scratch("generate_seed");
  const std::string run = scratch.file("run");
  train_char_gpt(run);
  const std::string args = prompt_args(run, "fog", 60, "--temperature 1.0");
  Generated a = generate(scratch, args + " --seed 1");
  Generated b = generate(scratch, args + " --seed 1");
  Generated c = generate(scratch, args + " --seed 2");
  ASSERT_EQ(a.exit_code, 0) << a.log;
  EXPECT_EQ(a.text, b.text);
  EXPECT_NE(a.text, c.text);
}

TEST(Generate, TopKOneIsGreedyWhateverTheSeed) {
  ScratchDir scratch("generate_greedy");
  const std::string run = scratch.file("run");
  train_char_gpt(run);
  Generated a = generate(scratch, prompt_args(run, "The ", 30, "--top-k 1 --seed 1"));
  Generated b = generate(scratch, prompt_args(run, "The ", 30, "--top-k 1 --seed 99"));
  Generated c = generate(scratch, prompt_args(run, "The ", 30, "--temperature 0 --seed 5"));
  ASSERT_EQ(a.exit_code, 0) << a.log;
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.text, c.text);
}

TEST(Generate, StepChoosesACheckpointAndAMissingStepNamesTheOnesThere) {
  ScratchDir scratch("generate_step");
  const std::string run = scratch.file("run");
  train_char_gpt(run);
  Generated early = generate(scratch, prompt_args(run, "a", 5, "--step 3"));
  ASSERT_EQ(early.exit_code, 0) << early.log;
  EXPECT_NE(early.log.find("at step 3"), std::string::npos) << early.log;
  Generated missing = generate(scratch, prompt_args(run, "a", 5, "--step 4"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.log.find("no checkpoint of step 4 (it has: 3, 6)"), std::string::npos) << missing.log;
  // A step directory itself is a checkpoint to sample from.
  Generated direct = generate(scratch, quote(run + "/step_00000003") + " --prompt a --max-tokens 5");
  ASSERT_EQ(direct.exit_code, 0) << direct.log;
  EXPECT_EQ(direct.text, early.text);
}

// dpt-train stores a character run's vocabulary in its checkpoints, so the text file is not needed; a
// checkpoint without one (written before vocabularies were stored) needs the text file or --tokenizer ids.
TEST(Generate, ACharRunDecodesThroughItsStoredVocabularyOrElseNeedsTheTextOrIds) {
  ScratchDir scratch("generate_vocab");
  const std::string run = scratch.file("run"), text = scratch.file("story.txt");
  fs::copy_file(kStory, text);
  train_char_gpt(run, text);
  Generated stored = generate(scratch, prompt_args(run, "The ", 20, "--seed 3"));
  ASSERT_EQ(stored.exit_code, 0) << stored.log;
  EXPECT_NE(stored.log.find("stored in the checkpoint"), std::string::npos) << stored.log;
  fs::remove(text);
  Generated without_text = generate(scratch, prompt_args(run, "The ", 20, "--seed 3"));
  ASSERT_EQ(without_text.exit_code, 0) << without_text.log;
  EXPECT_EQ(without_text.text, stored.text);
  // An older checkpoint: no vocabulary in its metadata.
  const std::string prefix = run + "/step_00000006/checkpoint";
  optim::Checkpoint ck = optim::load_checkpoint(prefix);
  ASSERT_EQ(ck.state.extra.erase(kCharVocabKey), 1u);
  optim::save_checkpoint(prefix, ck.model, ck.optimizer, ck.state);
  Generated gone = generate(scratch, prompt_args(run, "The ", 20, "--seed 3"));
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_NE(gone.log.find(text), std::string::npos) << gone.log;
  EXPECT_NE(gone.log.find("--tokenizer ids"), std::string::npos) << gone.log;
  fs::copy_file(kStory, text);
  Generated rebuilt = generate(scratch, prompt_args(run, "The ", 20, "--seed 3"));
  ASSERT_EQ(rebuilt.exit_code, 0) << rebuilt.log;
  EXPECT_NE(rebuilt.log.find("rebuilt from"), std::string::npos) << rebuilt.log;
  EXPECT_EQ(rebuilt.text, stored.text);
  Generated ids = generate(scratch, quote(run) + " --tokenizer ids --prompt '1 2' --max-tokens 7 --seed 3");
  ASSERT_EQ(ids.exit_code, 0) << ids.log;
  std::istringstream words(ids.text);
  std::vector<int> tokens;
  for (int id; words >> id;) tokens.push_back(id);
  ASSERT_EQ(tokens.size(), 9u) << ids.text;
  EXPECT_EQ(tokens[0], 1);
  EXPECT_EQ(tokens[1], 2);
}

TEST(Generate, BadRunsAndOptionsExitWithAClearError) {
  ScratchDir scratch("generate_bad");
  const std::string run = scratch.file("run");
  train_char_gpt(run);
  Generated nowhere = generate(scratch, quote(scratch.file("nowhere")));
  EXPECT_EQ(nowhere.exit_code, 1);
  EXPECT_NE(nowhere.log.find("does not exist"), std::string::npos) << nowhere.log;
  Generated greek = generate(scratch, prompt_args(run, "Ω", 5, ""));
  EXPECT_EQ(greek.exit_code, 1);
  EXPECT_NE(greek.log.find("--prompt: character"), std::string::npos) << greek.log;
  EXPECT_EQ(generate(scratch, prompt_args(run, "a", 5, "--top-k -1")).exit_code, 2);
  EXPECT_EQ(generate(scratch, prompt_args(run, "a", 5, "--tokenizer words")).exit_code, 2);
  Generated cuda = generate(scratch, prompt_args(run, "a", 5, "--device cuda:64"));
  EXPECT_EQ(cuda.exit_code, 1);
  EXPECT_NE(cuda.log.find("--device cuda:64"), std::string::npos) << cuda.log;
  // A run of another model kind.
  const std::string mlp = scratch.file("mlp");
  RunResult r = train(config_path("mlp_synthetic.yaml"),
                      {"training.steps=2", "schedule.warmup_steps=0", "checkpoint.dir=" + mlp, "training.device=cpu"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Generated wrong = generate(scratch, quote(mlp));
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.log.find("only GPT runs can be sampled or exported"), std::string::npos) << wrong.log;
}

TEST(Generate, ATokenRunDecodesThroughGpt2sTokenizer) {
  ScratchDir scratch("generate_gpt2");
  const std::string tokens = scratch.file("story.bin"), run = scratch.file("run");
  RunResult t = run_shell(bin("dpt-tokenize") + " --input " + quote(kStory) + " --output " + quote(tokens));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  RunResult r = train(config_path("char_gpt.yaml"),
                      {"data.kind=tokens", "data.path=" + tokens, "training.steps=2", "training.batch_size=2",
                       "schedule.warmup_steps=0", "checkpoint.dir=" + run, "model.gpt.n_layer=1", "model.gpt.n_embd=16",
                       "data.seq_len=16", "eval.sample_tokens=0", "logging.progress_bar=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Generated a = generate(scratch, prompt_args(run, "The keeper wrote", 8, "--seed 4"));
  Generated b = generate(scratch, prompt_args(run, "The keeper wrote", 8, "--seed 4"));
  ASSERT_EQ(a.exit_code, 0) << a.log;
  EXPECT_NE(a.log.find("GPT-2 BPE"), std::string::npos) << a.log;
  EXPECT_EQ(a.text.substr(0, 16), "The keeper wrote");
  EXPECT_GT(a.text.size(), 16u + 1u);
  EXPECT_EQ(a.text, b.text);
}

}  // namespace
}  // namespace dpt::train
