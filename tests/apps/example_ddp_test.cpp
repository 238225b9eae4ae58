// dpt-example-ddp, the data-parallel example: two and three processes under dpt-run (Gloo on the CPU)
// follow the single process's trajectory, because equal shards' averaged gradients are the whole
// batch's gradient.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "train_test_util.h"

namespace dpt::train::test_util {
namespace {

// The "step N  loss X" lines rank 0 prints, in order.
std::vector<double> losses(const std::string& output) {
  std::vector<double> out;
  static const std::regex line(R"(step +\d+  loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    out.push_back(std::stod((*it)[1]));
  }
  return out;
}

RunResult example(int nproc, const std::string& args) {
  std::string cmd;
  if (nproc > 1) cmd = bin("dpt-run") + " --standalone --nproc-per-node " + std::to_string(nproc) + " -- ";
  return run_shell(cmd + bin("dpt-example-ddp") + " --device cpu " + args);
}

TEST(ExampleDdp, EveryWorldSizeFollowsTheSingleProcessTrajectory) {
  const RunResult one = example(1, "--steps 101");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> reference = losses(one.output);
  ASSERT_EQ(reference.size(), 3u) << one.output;  // steps 0, 50, 100
  EXPECT_LT(reference.back(), 0.25 * reference.front()) << "the single process did not learn: " << one.output;
  for (int nproc : {2, 3}) {
    const RunResult many = example(nproc, "--steps 101");
    ASSERT_EQ(many.exit_code, 0) << many.output;
    const std::vector<double> l = losses(many.output);
    ASSERT_EQ(l.size(), reference.size()) << many.output;
    // Step 0 is the same model on the same points: equal to the printed digits. Later steps differ only
    // by the order of floating-point sums, which AdamW carries forward.
    EXPECT_DOUBLE_EQ(l[0], reference[0]) << nproc << " processes";
    for (size_t i = 1; i < l.size(); ++i) EXPECT_NEAR(l[i], reference[i], 1e-3 * reference[i] + 1e-5) << i;
  }
}

TEST(ExampleDdp, AMalformedNumberIsRefusedNamingTheOption) {
  const RunResult r = example(1, "--steps 1e3");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--steps"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dpt::train::test_util
