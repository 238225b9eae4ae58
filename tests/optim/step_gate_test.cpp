// Steps decided on the device (optim/step_outcome.h): the outcome's known answers, and an update gated
// by {skip, scale} in memory equal bit for bit to the same decisions taken on the host, on the CPU and,
// where there is one, on a GPU (where Adam's kernels read the gate themselves).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/host_readback.h"
#include "core/ops.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/step_outcome.h"
#include "twin_runs.h"

namespace dpt::optim {
namespace {

TensorOptions f64_on(Device device) { return TensorOptions{}.with_dtype(DType::Float64).with_device(device); }

using test::expect_same_bits;
using Trained = test::TwinRun;

Trained make_run(Device device, bool twins) {
  return test::make_twin_run(device, twins, 11, {{"a.weight", {37, 19}}, {"a.bias", {19}}, {"b.weight", {16390}}});
}

// Step `step`'s gradients, the same for every run.
void set_grads(Trained& r, int step) {
  Generator gen(200 + static_cast<uint64_t>(step));
  for (size_t i = 0; i < r.params.size(); ++i) {
    const Tensor& p = r.params[i].second;
    Tensor g = randn(p.shape(), gen).to(p.device());
    if (r.twins.empty()) {
      p.set_grad(g);
    } else {
      r.twins[i].second.set_grad(g.to(DType::BFloat16));
    }
  }
}

// {skip, gradient scale} per step: updates, skips (one with a scale that must not matter), clipping.
const std::vector<std::pair<double, double>> kDecisions = {{0, 1}, {1, 0.25}, {0, 0.5}, {1, 1}, {0, 1}, {0, 0.75}};

// One gate tensor, set once and rewritten before each step: the update must read it when it runs.
void gate_matches_host_decisions(Device device, bool twins) {
  Trained host = make_run(device, twins), gated = make_run(device, twins);
  Tensor gate = zeros({2}, f64_on(device));
  gated.opt->set_gate(gate);
  int64_t updates = 0;
  for (int s = 0; s < static_cast<int>(kDecisions.size()); ++s) {
    const auto [skip, scale] = kDecisions[static_cast<size_t>(s)];
    set_grads(host, s);
    set_grads(gated, s);
    if (skip == 0) {
      host.opt->set_grad_scale(scale);
      host.opt->step();
      ++updates;
    }
    gate.copy_(from_vector<double>({skip, scale}, {2}, f64_on(Device::cpu())));
    gated.opt->step();
    const std::string at = " after step " + std::to_string(s);
    for (size_t i = 0; i < host.params.size(); ++i) {
      expect_same_bits(gated.params[i].second, host.params[i].second, "master " + host.params[i].first + at);
      if (twins) expect_same_bits(gated.twins[i].second, host.twins[i].second, "twin " + host.params[i].first + at);
    }
    const NamedTensors a = gated.opt->state_dict(), b = host.opt->state_dict();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) expect_same_bits(a[i].second, b[i].second, a[i].first + at);
    EXPECT_EQ(gated.opt->step_count(), updates) << "a skipped step is not counted" << at;
  }
  EXPECT_EQ(updates, 4);
}

TEST(StepGate, AGatedAdamWEqualsTheSameDecisionsTakenOnTheHostOnCpu) {
  gate_matches_host_decisions(Device::cpu(), false);
}

TEST(StepGate, CudaAdamWReadsTheGateOnTheDeviceAndEqualsTheHostDecisions) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  gate_matches_host_decisions(Device::cuda(), false);
}

TEST(StepGate, CudaAdamWThroughBf16TwinsReadsTheGateOnTheDeviceAndEqualsTheHostDecisions) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  gate_matches_host_decisions(Device::cuda(), true);
}

TEST(StepGate, ARestoredOptimizerCountsOnFromTheLoadedStep) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Trained a = make_run(Device::cuda(), false), b = make_run(Device::cuda(), false);
  for (int s = 0; s < 3; ++s) {
    set_grads(a, s);
    a.opt->step();
  }
  Tensor gate = from_vector<double>({0, 1}, {2}, f64_on(Device::cuda()));
  b.opt->set_gate(gate);  // counts on the device from here
  b.opt->load_state_dict(a.opt->state_dict());
  for (size_t i = 0; i < a.params.size(); ++i) b.params[i].second.copy_(a.params[i].second);
  set_grads(a, 3);
  set_grads(b, 3);
  a.opt->step();
  b.opt->step();
  EXPECT_EQ(b.opt->step_count(), 4);
  for (size_t i = 0; i < a.params.size(); ++i)
    expect_same_bits(b.params[i].second, a.params[i].second, "step 4 after a restore: " + a.params[i].first);
}

// Gradients 3, 4 (float32) and 12 (bf16 on a GPU, exact there): norm 13.
std::vector<Tensor> known_grads(Device device, double last = 12) {
  Tensor a = zeros({2}, TensorOptions{}.with_device(device)), b = zeros({1}, TensorOptions{}.with_device(device));
  a.requires_grad_(true);
  a.set_grad(from_vector<float>({3, 4}, {2}).to(device));
  Tensor twelve = from_vector<float>({static_cast<float>(last)}, {1}).to(device);
  if (device.is_cuda()) {
    b = b.to(DType::BFloat16);
    twelve = twelve.to(DType::BFloat16);
  }
  b.requires_grad_(true);
  b.set_grad(twelve);
  return {a, b};
}

std::vector<double> outcome_of(Device device, float loss_sum, double last_grad, double max_norm, bool stop) {
  const Tensor loss = from_vector<float>({loss_sum}, {1}).to(device);
  const Tensor sum_squares = grad_sum_of_squares(known_grads(device, last_grad), device);
  // The stop flag as a trainer keeps it: page-locked host memory on a GPU, which the device reads.
  double* flag = device.is_cuda() ? static_cast<double*>(cuda::allocate_pinned(sizeof(double))) : new double;
  *flag = stop ? 1 : 0;
  const Tensor agreed = step_agreement(loss, 4, flag);
  EXPECT_EQ(agreed.device(), device);
  const Tensor outcome = step_outcome(agreed, sum_squares, max_norm);
  EXPECT_EQ(outcome.device(), device);
  std::vector<double> values = outcome.to(Device::cpu()).to_vector<double>();  // waits for the device
  if (device.is_cuda()) {
    cuda::free_pinned(flag);
  } else {
    delete flag;
  }
  return values;
}

void outcome_has_known_answers(Device device) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = outcome_of(device, 6, 12, 1.0, false);
  EXPECT_EQ(v[kStepLoss], 1.5);
  EXPECT_EQ(v[kStepStop], 0);
  EXPECT_EQ(v[kStepSkip], 0);
  EXPECT_EQ(v[kGradNorm], 13);
  EXPECT_EQ(v[kGradScale], 1.0 / (13 + 1e-6));
  EXPECT_EQ(outcome_of(device, 6, 12, 20.0, true), (std::vector<double>{1.5, 1, 0, 1, 13}))
      << "below max_norm nothing is clipped; a stop request is a 1";
  EXPECT_EQ(outcome_of(device, 6, 12, 0.0, false)[kGradScale], 1) << "max_norm 0: no clipping";
  v = outcome_of(device, std::numeric_limits<float>::quiet_NaN(), 12, 1.0, false);
  EXPECT_EQ(v[kStepSkip], 1) << "a NaN loss skips the step";
  v = outcome_of(device, 6, inf, 1.0, false);
  EXPECT_EQ(v[kStepSkip], 1) << "an infinite gradient skips the step";
  EXPECT_EQ(v[kGradNorm], inf);
  EXPECT_EQ(v[kGradScale], 1) << "a non-finite norm is not clipped (the step is skipped)";
}

// Ranks sum their agreements before the outcome: one rank's NaN loss or stop request reaches every rank.
TEST(StepOutcome, OneRanksNonFiniteLossOrStopReachesTheSummedOutcome) {
  const Device cpu = Device::cpu();
  double no = 0, yes = 1;
  const Tensor sum_squares = grad_sum_of_squares(known_grads(cpu), cpu);
  const Tensor fine = step_agreement(from_vector<float>({6}, {1}), 4, &no);
  const Tensor nan = step_agreement(from_vector<float>({std::numeric_limits<float>::quiet_NaN()}, {1}), 4, &no);
  const Tensor stopping = step_agreement(from_vector<float>({2}, {1}), 4, &yes);
  std::vector<double> v = step_outcome(fine + stopping, sum_squares, 0).to_vector<double>();
  EXPECT_EQ(v, (std::vector<double>{2.0, 1, 0, 1, 13})) << "loss 1.5 + 0.5, one rank's stop";
  v = step_outcome(fine + nan, sum_squares, 0).to_vector<double>();
  EXPECT_TRUE(std::isnan(v[kStepLoss]));
  EXPECT_EQ(v[kStepSkip], 1) << "one rank's NaN loss skips the step everywhere";
}

TEST(StepOutcome, LossNormSkipAndClipFactorHaveTheirKnownValuesOnCpu) { outcome_has_known_answers(Device::cpu()); }

TEST(StepOutcome, CudaFloat32AndBf16GradientsGiveTheSameKnownValues) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  outcome_has_known_answers(Device::cuda());
}

// The copy is taken where it is enqueued: work enqueued after it (here, overwriting the values) does not
// reach the host's copy.
void readback_copies_in_stream_order(Device device) {
  HostReadback readback(device, 3);
  Tensor values = from_vector<double>({1.5, -2, 7}, {3}, f64_on(device));
  readback.copy(values);
  values.fill_(9);
  EXPECT_EQ(readback.values(), (std::vector<double>{1.5, -2, 7}));
  readback.copy(values);
  EXPECT_EQ(readback.values(), (std::vector<double>{9, 9, 9}));
  EXPECT_THROW(readback.copy(zeros({2}, f64_on(device))), Error) << "the wrong number of values";
}

TEST(HostReadbackTest, ValuesAreThoseOfTheCopyNotOfLaterWorkOnCpu) { readback_copies_in_stream_order(Device::cpu()); }

TEST(HostReadbackTest, CudaValuesAreThoseOfTheCopyNotOfLaterWork) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  readback_copies_in_stream_order(Device::cuda());
}

}  // namespace
}  // namespace dpt::optim
