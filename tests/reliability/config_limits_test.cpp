// A config full of unknown keys is refused quickly with a readable message: the first few unknown keys
// are described (with suggestions, which cost a search of the schema each), the rest counted. A file of
// 1.5 million of them used to run for minutes building a message of as many lines.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config.h"

namespace {

const dpt::train::LoadOptions kNoDevice{.check_files = true, .check_device = false};

std::vector<std::string> problems_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    dpt::train::load_config_text(yaml, "many.yaml", overrides, kNoDevice);
  } catch (const dpt::train::ConfigError& e) {
    return e.problems();
  }
  ADD_FAILURE() << "the config loaded";
  return {};
}

TEST(ConfigLimits, OnlyTheFirstTwentyUnknownKeysAreDescribedAndTheRestCounted) {
  std::string yaml = "training:\n  steps: 3\n";
  for (int i = 0; i < 5000; ++i) yaml += "  stpes_" + std::to_string(i) + ": 1\n";
  const std::vector<std::string> problems = problems_of(yaml, {"+training.bogus=1"});
  ASSERT_EQ(problems.size(), 21u);
  EXPECT_EQ(problems[0].rfind("many.yaml:3:3: training.stpes_0: unknown key", 0), 0u) << problems[0];
  EXPECT_EQ(problems[19].rfind("many.yaml:22:3: training.stpes_19: unknown key", 0), 0u) << problems[19];
  // The override's unknown key is one of the counted ones.
  EXPECT_EQ(problems[20], "many.yaml: 4981 more unknown keys (the first 20 are listed above)");
}

TEST(ConfigLimits, OtherProblemsAreStillAllReported) {
  std::string yaml = "training:\n  steps: -1\n  batch_size: 0\n";
  for (int i = 0; i < 30; ++i) yaml += "  x" + std::to_string(i) + ": 1\n";
  const std::vector<std::string> problems = problems_of(yaml);
  ASSERT_EQ(problems.size(), 23u);
  int steps = 0, batch = 0;
  for (const auto& p : problems) {
    steps += p.find("training.steps") != std::string::npos;
    batch += p.find("training.batch_size") != std::string::npos;
  }
  EXPECT_EQ(steps, 1);
  EXPECT_EQ(batch, 1);
  EXPECT_EQ(problems.back(), "many.yaml: 10 more unknown keys (the first 20 are listed above)");
}

}  // namespace
