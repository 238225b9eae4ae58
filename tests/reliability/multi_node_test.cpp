// Two "nodes" in two network namespaces joined by a veth pair (scripts/netns-test.sh): DDP parity of
// 2 nodes x 2 ranks against the single-process run, and a link cut mid-run ending both nodes with an
// error. Needs root for `ip netns`; skipped where that is not permitted.
#include <gtest/gtest.h>

#include <string>

#include "processes.h"

namespace {

using dpt::reliability::Child;
using dpt::reliability::ScratchDir;

TEST(MultiNode, TwoNetworkNamespacesTrainInParityAndACutLinkFailsEveryNode) {
  ScratchDir dir;
  Child script({"/bin/bash", DPT_SOURCE_DIR "/scripts/netns-test.sh"}, dir.file("netns.log"),
               {"DPT_BUILD_DIR=" DPT_BINARY_DIR});
  auto f = script.wait(240);
  ASSERT_FALSE(f.hung) << f.output;
  if (f.output.find("netns-test: skipped") != std::string::npos) GTEST_SKIP() << f.output;
  EXPECT_EQ(f.exit_code, 0) << f.output;
  EXPECT_NE(f.output.find("DDP parity (mlp, 2 nodes x 2 ranks over veth) OK"), std::string::npos) << f.output;
  EXPECT_NE(f.output.find("DDP parity (gpt, 2 nodes x 2 ranks over veth) OK"), std::string::npos) << f.output;
  EXPECT_NE(f.output.find("link cut ended both nodes"), std::string::npos) << f.output;
}

}  // namespace
