// DDP parity: N ranks x batch b must train exactly like one process on the N*b batch (worker:
// workers/ddp_parity.cpp). CPU cases run on Gloo in CI; CUDA cases need 2 GPUs (NCCL), the FourGpus ones 4.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>

#include "core/cuda_runtime.h"
#include "distributed/ddp.h"
#include "distributed/grad_bucket.h"
#include "core/factory.h"
#include "worker_command.h"

namespace {

struct RunResult {
  int exit_code;
  std::string output;
};

RunResult launch(int nproc, const std::string& args) {
  const std::string bin = std::string(DPT_BINARY_DIR) + "/bin/";
  std::string cmd = bin + "dpt-run --standalone --nproc-per-node " + std::to_string(nproc) + " -- " +
                    worker_command(bin + "dpt_test_ddp_parity") + " " + args + " 2>&1";
  RunResult r{-1, ""};
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), pipe)) r.output += buf.data();
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void expect_passes(int nproc, const std::string& args) {
  RunResult r = launch(nproc, args);
  EXPECT_EQ(r.exit_code, 0) << "dpt-run " << nproc << " x " << args << ":\n" << r.output;
}

void expect_fails_with(int nproc, const std::string& args, const std::string& message) {
  RunResult r = launch(nproc, args);
  EXPECT_NE(r.exit_code, 0) << "dpt-run " << nproc << " x " << args << " should have failed:\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "' in:\n" << r.output;
}

}  // namespace

TEST(DdpBuckets, FillInReverseOrderWithSmallFirstBucketAndNeverSplit) {
  using dpt::zeros;
  // 4-byte floats: 100, 300, 50, 400 elements; caps 1000 B first, then 1600 B.
  std::vector<dpt::Tensor> params = {zeros({100}), zeros({300}), zeros({50}), zeros({400})};
  std::vector<size_t> order = {3, 2, 1, 0};
  auto buckets = dpt::dist::assign_buckets(params, order, 1000, 1600);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{3}));     // 1600 B alone: over the first cap
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{2, 1}));  // 200 + 1200 B
  EXPECT_EQ(buckets[2].params, (std::vector<size_t>{0}));
}

TEST(DdpBuckets, SeparateDtypes) {
  std::vector<dpt::Tensor> params = {dpt::zeros({10}), dpt::zeros({10}, dpt::TensorOptions{}.with_dtype(dpt::DType::Float64)),
                                     dpt::zeros({10})};
  auto buckets = dpt::dist::assign_buckets(params, {2, 1, 0}, 1 << 20, 1 << 20);
  ASSERT_EQ(buckets.size(), 2u);
  for (const auto& b : buckets) {
    for (size_t i : b.params) EXPECT_EQ(params[i].dtype(), params[b.params[0]].dtype());
  }
}

TEST(DdpParityCpu, MlpTwoRanksDefaultBuckets) { expect_passes(2, "mlp default cpu"); }
TEST(DdpParityCpu, MlpThreeRanksDefaultBuckets) { expect_passes(3, "mlp default cpu"); }
TEST(DdpParityCpu, MlpTwoRanksTinyBuckets) { expect_passes(2, "mlp tiny cpu"); }
TEST(DdpParityCpu, MlpTwoRanksOneBucket) { expect_passes(2, "mlp one cpu"); }
TEST(DdpParityCpu, BucketLayoutsAgreeTwoRanks) { expect_passes(2, "mlp layouts cpu"); }
TEST(DdpParityCpu, BucketLayoutsAgreeThreeRanks) { expect_passes(3, "mlp layouts cpu"); }
TEST(DdpParityCpu, GptTwoRanks) { expect_passes(2, "gpt default cpu"); }
TEST(DdpParityCpu, GptThreeRanks) { expect_passes(3, "gpt default cpu"); }
TEST(DdpParityCpu, NoSyncAccumulationEqualsBigBatch) { expect_passes(2, "mlp nosync cpu"); }
TEST(DdpParityCpu, GptNoSyncAccumulationThreeRanks) { expect_passes(3, "gpt nosync cpu"); }
TEST(DdpParityCpu, Bf16CommunicationWithinBf16Tolerance) { expect_passes(2, "mlp bf16comm cpu"); }
TEST(DdpParityCpu, OptimizerStepPerBucketInsideBackward) { expect_passes(2, "mlp overlap cpu"); }
TEST(DdpParityCpu, UpdateStreamTimingFallsBackToBackwardEndOnCpu) { expect_passes(2, "mlp overlapstream cpu"); }
TEST(DdpParityCpu, GptOptimizerStepPerBucketThreeRanks) { expect_passes(3, "gpt overlap cpu"); }
TEST(DdpParityCpu, ShardedBucketsCutLargeParametersThreeRanks) { expect_passes(3, "gpt shardlayout cpu"); }
TEST(DdpParityCpu, ZeroShardedOptimizerTwoRanks) { expect_passes(2, "mlp zero cpu"); }
TEST(DdpParityCpu, ZeroShardedOptimizerGptThreeRanks) { expect_passes(3, "gpt zero cpu"); }
TEST(DdpParityCpu, ZeroShardedOptimizerTinyBucketsThreeRanks) { expect_passes(3, "mlp zerotiny cpu"); }
TEST(DdpParityCpu, ZeroShardedOptimizerBf16Twins) { expect_passes(2, "mlp zerobf16 cpu"); }
// ZeRO-1 stepped after backward, with clipping by the global norm and whole-parameter optimizer state.
TEST(DdpParityCpu, ZeroOnStepClipsAndStepsLikeOneProcessTwoRanks) { expect_passes(2, "mlp zerostep cpu"); }
TEST(DdpParityCpu, ZeroOnStepGptThreeRanks) { expect_passes(3, "gpt zerostep cpu"); }
TEST(DdpParityCpu, ZeroOnStepTinyBucketsThreeRanks) { expect_passes(3, "mlp zerosteptiny cpu"); }
// Several buckets per block: updated in the order the next forward reads them.
TEST(DdpParityCpu, ZeroOnStepGptSmallBucketsInForwardReadingOrder) { expect_passes(2, "gpt zerostepsmall cpu"); }
TEST(DdpParityCpu, ZeroOnStepBf16TwinsGatherTheMasters) { expect_passes(2, "mlp zerostepbf16 cpu"); }
TEST(DdpParityCpu, GatheredOnStepClipsAndStepsLikeOneProcessTwoRanks) { expect_passes(2, "mlp gatheredstep cpu"); }
TEST(DdpParityCpu, GatheredOnStepFourRanks) { expect_passes(4, "mlp gatheredstep cpu"); }
TEST(DdpParityCpu, GatheredOnStepBf16TwinsGatherTheMasters) { expect_passes(2, "mlp gatheredstepbf16 cpu"); }
TEST(DdpParityCpu, ZeroUpdateStreamTimingFallsBackToBackwardEndOnCpu) { expect_passes(2, "gpt zerostream cpu"); }
// ZeRO-1 whose Linear gradients are formed from every rank's gathered inputs and output gradients.
TEST(DdpParityCpu, GatheredGradientsTwoRanks) { expect_passes(2, "mlp gathered cpu"); }
TEST(DdpParityCpu, GatheredGradientsFourRanks) { expect_passes(4, "mlp gathered cpu"); }
TEST(DdpParityCpu, GatheredGradientsBf16Twins) { expect_passes(2, "mlp gatheredbf16 cpu"); }
TEST(DdpParityCpu, GatheredGradientsNeedOnlyLinears) {
  expect_fails_with(2, "gpt gathered cpu", "is not a Linear's weight or bias");
}
TEST(DdpParityCpu, GatheredGradientsRefuseASecondForwardBeforeBackward) {
  expect_fails_with(2, "mlp gatheredtwice cpu", "Linear '0' ran forward twice before a backward");
}
TEST(DdpParityCpu, GatheredGradientsNeedDivisibleRows) {
  expect_fails_with(3, "mlp gathered cpu", "not divisible by the world size 3");
}
TEST(DdpParityCpu, UnusedParametersDoNotHang) { expect_passes(2, "mlp unused cpu"); }
TEST(DdpParityCpu, ZeroWithUnusedParametersStraddlingBucketsThreeRanks) { expect_passes(3, "mlp zerounused cpu"); }
TEST(DdpParityCpu, AnInstalledExchangeLaunchesAndFinishesEveryBucketInIndexOrder) {
  expect_passes(2, "mlp customexchange cpu");
}
TEST(DdpParityCpu, ModelMismatchIsAnErrorOnEveryRank) { expect_passes(2, "mlp mismatch cpu"); }

class DdpParityCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (dpt::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  }
};
TEST_F(DdpParityCuda, MlpTwoGpus) { expect_passes(2, "mlp default cuda"); }
TEST_F(DdpParityCuda, GptTwoGpus) { expect_passes(2, "gpt default cuda"); }
TEST_F(DdpParityCuda, LayoutsTwoGpus) { expect_passes(2, "mlp layouts cuda"); }
TEST_F(DdpParityCuda, NoSyncTwoGpus) { expect_passes(2, "gpt nosync cuda"); }
TEST_F(DdpParityCuda, UnusedTwoGpus) { expect_passes(2, "mlp unused cuda"); }
TEST_F(DdpParityCuda, OverlappedOptimizerTwoGpus) { expect_passes(2, "gpt overlap cuda"); }
TEST_F(DdpParityCuda, Bf16CommTwoGpus) { expect_passes(2, "mlp bf16comm cuda"); }
TEST_F(DdpParityCuda, ZeroTwoGpus) { expect_passes(2, "gpt zero cuda"); }
TEST_F(DdpParityCuda, ZeroBf16TwinsTwoGpus) { expect_passes(2, "gpt zerobf16 cuda"); }
// ZeRO-1 with each bucket's update and all-gather during backward, on the update stream.
TEST_F(DdpParityCuda, ZeroUpdateStreamTwoGpus) { expect_passes(2, "gpt zerostream cuda"); }
TEST_F(DdpParityCuda, ZeroUpdateStreamBf16TwinsTwoGpus) { expect_passes(2, "gpt zerostreambf16 cuda"); }
TEST_F(DdpParityCuda, ZeroOnStepGptTwoGpus) { expect_passes(2, "gpt zerostep cuda"); }
TEST_F(DdpParityCuda, ZeroOnStepBf16TwinsTwoGpus) { expect_passes(2, "gpt zerostepbf16 cuda"); }
TEST_F(DdpParityCuda, GatheredOnStepTwoGpus) { expect_passes(2, "mlp gatheredstep cuda"); }
TEST_F(DdpParityCuda, GatheredOnStepBf16TwinsTwoGpus) { expect_passes(2, "mlp gatheredstepbf16 cuda"); }
TEST_F(DdpParityCuda, UpdateStreamOptimizerInBackwardTwoGpus) { expect_passes(2, "gpt overlapstream cuda"); }
// ZeRO-1's sharded buckets on the copy engines (DDPOptions::copy_engines): all-to-alls and all-gathers
// between symmetric windows, each bucket averaged by our kernel; at the end of backward, on the update
// stream, on step() in bf16, with tiny buckets (block boundaries every 64 elements), and captured.
TEST_F(DdpParityCuda, ZeroCopyEnginesTwoGpus) { expect_passes(2, "gpt zero cuda ce_collectives"); }
TEST_F(DdpParityCuda, ZeroCopyEnginesTinyBucketsTwoGpus) { expect_passes(2, "mlp zerotiny cuda ce_collectives"); }
TEST_F(DdpParityCuda, ZeroUpdateStreamCopyEnginesTwoGpus) { expect_passes(2, "gpt zerostream cuda ce_collectives"); }
TEST_F(DdpParityCuda, ZeroOnStepCopyEnginesBf16TwoGpus) { expect_passes(2, "gpt zerostepbf16 cuda ce_collectives"); }
TEST_F(DdpParityCuda, CudaGraphZeroUpdateStreamCopyEnginesTwoGpus) {
  expect_passes(2, "gpt zerostreamgraph cuda ce_collectives");
}
// The whole step, AllReduces included, captured in a CUDA graph and replayed (NCCL).
TEST_F(DdpParityCuda, CudaGraphMlpTwoGpus) { expect_passes(2, "mlp graph cuda nccl"); }
TEST_F(DdpParityCuda, CudaGraphGptTwoGpus) { expect_passes(2, "gpt graph cuda nccl"); }
// ZeRO-1 captured: reduce-scatters, the sharded update and the parameter all-gathers in one graph.
TEST_F(DdpParityCuda, CudaGraphZeroMlpTwoGpus) { expect_passes(2, "mlp zerograph cuda nccl"); }
TEST_F(DdpParityCuda, CudaGraphZeroGptTwoGpus) { expect_passes(2, "gpt zerograph cuda nccl"); }
TEST_F(DdpParityCuda, CudaGraphZeroUpdateStreamGptTwoGpus) { expect_passes(2, "gpt zerostreamgraph cuda nccl"); }
TEST_F(DdpParityCuda, CudaGraphZeroUpdateStreamMlpTwoGpus) { expect_passes(2, "mlp zerostreamgraph cuda nccl"); }
// Gradients from gathered inputs: eager, bf16 twins, and captured with the update stream and both
// communicators inside the graph.
TEST_F(DdpParityCuda, GatheredGradientsTwoGpus) { expect_passes(2, "mlp gathered cuda"); }
TEST_F(DdpParityCuda, GatheredGradientsBf16TwoGpus) { expect_passes(2, "mlp gatheredbf16 cuda"); }
TEST_F(DdpParityCuda, CudaGraphGatheredGradientsTwoGpus) { expect_passes(2, "mlp gatheredgraph cuda nccl"); }
// The same with every all-gather on the copy engines (weights and gathered rows in symmetric windows).
TEST_F(DdpParityCuda, GatheredGradientsCopyEnginesTwoGpus) { expect_passes(2, "mlp gathered cuda ce_collectives"); }
TEST_F(DdpParityCuda, GatheredOnStepBf16CopyEnginesTwoGpus) {
  expect_passes(2, "mlp gatheredstepbf16 cuda ce_collectives");
}
TEST_F(DdpParityCuda, CudaGraphGatheredGradientsCopyEnginesTwoGpus) {
  expect_passes(2, "mlp gatheredgraph cuda ce_collectives");
}

// On more than two ranks gathered gradients send every layer's inputs in one gather a step (one window holds
// every layer's rows), which two GPUs never reach.
class DdpParityCudaFourGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    if (dpt::cuda::device_count() < 4) GTEST_SKIP() << "needs 4 GPUs";
  }
};
TEST_F(DdpParityCudaFourGpus, GatheredOnStep) { expect_passes(4, "mlp gatheredstep cuda"); }
TEST_F(DdpParityCudaFourGpus, GatheredOnStepBf16CopyEngines) {
  expect_passes(4, "mlp gatheredstepbf16 cuda ce_collectives");
}
TEST_F(DdpParityCudaFourGpus, CudaGraphGatheredGradientsCopyEngines) {
  expect_passes(4, "mlp gatheredgraph cuda ce_collectives");
}

