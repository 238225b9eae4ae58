// dpt-tokenize as a user runs it: text in, .bin token files out that data::TokenFile reads back to
// exactly GPT-2's ids of the text.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/char_text.h"
#include "data/gpt2_bpe.h"
#include "data/token_file.h"
#include "train_test_util.h"

namespace dpt::train {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

const std::string kStory = std::string(DPT_SOURCE_DIR) + "/data/corpus/tiny.txt";

std::vector<int32_t> tokens_of(const data::TokenFile& file) {
  return std::vector<int32_t>(file.tokens(), file.tokens() + file.size());
}

TEST(Tokenize, WritesTrainAndValidationFilesThatReadBackToGpt2sIds) {
  ScratchDir dir("tokenize");
  const std::string train = dir.file("story_train.bin"), val = dir.file("story_val.bin");
  RunResult r = run_shell(bin("dpt-tokenize") + " --input " + quote(kStory) + " --output " + quote(train) +
                          " --val-output " + quote(val) + " --val-fraction 0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<int32_t> expected = data::Gpt2Tokenizer::load().encode(data::read_text_file(kStory));
  ASSERT_EQ(expected.size(), 1512u);  // tiktoken's count for this file
  data::TokenFile train_file(train), val_file(val);
  EXPECT_EQ(val_file.size(), 151);  // round(0.1 * 1512): the tail
  EXPECT_EQ(train_file.size(), 1361);
  std::vector<int32_t> all = tokens_of(train_file);
  const std::vector<int32_t> tail = tokens_of(val_file);
  all.insert(all.end(), tail.begin(), tail.end());
  EXPECT_EQ(all, expected);
  EXPECT_NE(r.output.find("1512 GPT-2 tokens"), std::string::npos) << r.output;
}

TEST(Tokenize, WithoutValidationOutputEveryTokenGoesToTheOutput) {
  ScratchDir dir("tokenize_all");
  const std::string out = dir.file("all.bin");
  RunResult r = run_shell(bin("dpt-tokenize") + " -i " + quote(kStory) + " -o " + quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(tokens_of(data::TokenFile(out)), data::Gpt2Tokenizer::load().encode(data::read_text_file(kStory)));
}

TEST(Tokenize, BadInputsExitWithAClearErrorAndWriteNothing) {
  ScratchDir dir("tokenize_bad");
  const std::string out = dir.file("out.bin");
  RunResult missing =
      run_shell(bin("dpt-tokenize") + " --input " + quote(dir.file("nope.txt")) + " --output " + quote(out));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("nope.txt"), std::string::npos) << missing.output;
  RunResult fraction = run_shell(bin("dpt-tokenize") + " --input " + quote(kStory) + " --output " + quote(out) +
                                 " --val-output " + quote(dir.file("v.bin")) + " --val-fraction 1.5");
  EXPECT_EQ(fraction.exit_code, 2) << fraction.output;
  EXPECT_NE(fraction.output.find("--val-fraction"), std::string::npos) << fraction.output;
  RunResult everything = run_shell(bin("dpt-tokenize") + " --input " + quote(kStory) + " --output " + quote(out) +
                                   " --val-output " + quote(dir.file("v.bin")) + " --val-fraction 1");
  EXPECT_EQ(everything.exit_code, 1) << everything.output;
  EXPECT_NE(everything.output.find("nothing is left for --output"), std::string::npos) << everything.output;
  RunResult vocab = run_shell(bin("dpt-tokenize") + " --input " + quote(kStory) + " --output " + quote(out) +
                              " --tokenizer-dir " + quote(dir.file("no_vocab")));
  EXPECT_EQ(vocab.exit_code, 1) << vocab.output;
  EXPECT_NE(vocab.output.find("encoder.json"), std::string::npos) << vocab.output;
  EXPECT_EQ(run_shell(bin("dpt-tokenize") + " --output " + quote(out)).exit_code, 2);  // --input is required
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir.file("v.bin")));
}

}  // namespace
}  // namespace dpt::train
