// synthetic_tokens writes its corpus to data.path on first use; it must never overwrite a file it did not
// write (somebody's real token file, or anything else), only its own (marked in the header's reserved
// ints, or, from before the mark, holding exactly the corpus asked for).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/train_test_util.h"
#include "core/error.h"
#include "data/token_file.h"
#include "processes.h"

namespace {

namespace fs = std::filesystem;
using dpt::reliability::Child;
using dpt::reliability::Finished;
using dpt::reliability::kBin;
using dpt::reliability::ScratchDir;
using dpt::train::test_util::read_text;


constexpr double kLimit = 120;  // seconds: only catches hangs

// A small GPT on synthetic tokens at `path`.
Finished synthetic_run(const ScratchDir& dir, const std::string& path, const std::string& log) {
  std::vector<std::string> argv = {kBin + "dpt-train", "--config", DPT_SOURCE_DIR "/configs/char_gpt.yaml"};
  for (const char* o :
       {"training.device=cpu", "training.steps=2", "schedule.warmup_steps=1", "model.gpt.n_layer=1",
        "model.gpt.n_head=2", "model.gpt.n_embd=16", "data.seq_len=8", "training.batch_size=4", "eval.sample_tokens=0",
        "data.kind=synthetic_tokens", "data.vocab_size=32", "data.num_tokens=2000"}) {
    argv.insert(argv.end(), {"--set", std::string(o)});
  }
  argv.insert(argv.end(), {"--set", "data.path=" + path, "--set", "checkpoint.dir=" + dir.file("run")});
  return Child(argv, dir.file(log)).wait(kLimit);
}

TEST(SyntheticTokenFile, TheTrainerNeverOverwritesATokenFileItDidNotWrite) {
  ScratchDir dir;
  const std::string path = dir.file("corpus.bin");
  dpt::data::write_token_file(path, dpt::data::synthetic_tokens(3000, 64, 7));  // someone's real data
  const std::string before = read_text(path);
  Finished f = synthetic_run(dir, path, "log");
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "data.path (data.kind synthetic_tokens): '" + path +
                                "' exists and was not written by synthetic_tokens (a token file of 3000 tokens)");
  EXPECT_EQ(read_text(path), before);
}

TEST(SyntheticTokenFile, TheTrainerNeverOverwritesAnyOtherFile) {
  ScratchDir dir;
  const std::string path = dir.file("notes.txt");
  std::ofstream(path) << "not tokens at all\n";
  Finished f = synthetic_run(dir, path, "log");
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_CONTAINS(f.output, "'" + path + "' exists and was not written by synthetic_tokens (not a token file)");
  EXPECT_EQ(read_text(path), "not tokens at all\n");
}

TEST(SyntheticTokenFile, RewritesOnlyItsOwnFiles) {
  ScratchDir dir;
  const std::string path = dir.file("gen.bin");
  EXPECT_TRUE(dpt::data::ensure_synthetic_token_file(path, 500, 100, 1));
  EXPECT_FALSE(dpt::data::ensure_synthetic_token_file(path, 500, 100, 1));  // this very corpus: kept
  // Its own file, asked for other parameters: regenerated.
  EXPECT_TRUE(dpt::data::ensure_synthetic_token_file(path, 600, 100, 2));
  dpt::data::TokenFile regenerated(path);
  EXPECT_EQ(regenerated.size(), 600);
  EXPECT_EQ(std::vector<uint16_t>(regenerated.tokens(), regenerated.tokens() + 600),
            dpt::data::synthetic_tokens(600, 100, 2));
  // A file of exactly the generated corpus written without the marker (by an earlier dptrain) is kept
  // as it is; asked for anything else, it is somebody's file.
  const std::string unmarked = dir.file("unmarked.bin");
  dpt::data::write_token_file(unmarked, dpt::data::synthetic_tokens(500, 100, 1));
  const std::string bytes = read_text(unmarked);
  EXPECT_FALSE(dpt::data::ensure_synthetic_token_file(unmarked, 500, 100, 1));
  EXPECT_THROW(dpt::data::ensure_synthetic_token_file(unmarked, 500, 100, 3), dpt::Error);
  EXPECT_EQ(read_text(unmarked), bytes);
  // A directory or a FIFO at the path: refused, without blocking.
  fs::create_directories(dir.file("d.bin"));
  EXPECT_THROW(dpt::data::ensure_synthetic_token_file(dir.file("d.bin"), 500, 100, 1), dpt::Error);
  ASSERT_EQ(::mkfifo(dir.file("f.bin").c_str(), 0600), 0);
  // A writer holds the FIFO open, so that even a blocking open returns.
  const int writer = ::open(dir.file("f.bin").c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(writer, 0);
  EXPECT_THROW(dpt::data::ensure_synthetic_token_file(dir.file("f.bin"), 500, 100, 1), dpt::Error);
  ::close(writer);
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("f.bin").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

}  // namespace
