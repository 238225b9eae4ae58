// Speculative AdamW (optim/adam.h, Adam::speculate): the update runs before its step is decided, into second
// copies of the masters and moments, and the decision keeps it or leaves everything as it was. Against the
// same steps decided first (the norm's pass over the gradients, the outcome, the gated update), bit for bit:
// masters, moments, twins and the step count after kept steps, after steps skipped for a non-finite gradient
// or loss, and after a step in which a parameter has no gradient; and a state saved after an odd number of
// steps (the second copies holding the state) resumes as the decided run continues. CUDA only: the
// speculative update is a fused kernel of the bf16 twins path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/step_outcome.h"
#include "twin_runs.h"

namespace dpt::optim {
namespace {

using test::expect_same_bits;
using Trained = test::TwinRun;

Trained make_run(bool speculative) {
  // A tensor of more than one chunk (16384 elements), odd sizes for the kernels' scalar tails.
  Trained r = test::make_twin_run(
      Device::cuda(), true, 5, {{"a.weight", {37, 19}}, {"a.bias", {19}}, {"b.weight", {16390}}, {"c.weight", {5, 3}}});
  if (speculative) r.opt->speculate();
  return r;
}

// What a step's gradients hold beyond random numbers.
enum class Twist { kNone, kNanGradient, kNanLoss, kNoGradient };

// Step `step`'s gradients, the same for every run.
void set_grads(Trained& r, int step, Twist twist) {
  Generator gen(300 + static_cast<uint64_t>(step));
  for (size_t i = 0; i < r.params.size(); ++i) {
    Tensor g = randn(r.params[i].second.shape(), gen);
    if (twist == Twist::kNanGradient && i == 2) g.data<float>()[16385] = std::numeric_limits<float>::quiet_NaN();
    if (twist == Twist::kNoGradient && i == 0) {
      r.twins[i].second.set_grad(Tensor());
      continue;
    }
    r.twins[i].second.set_grad(g.to(DType::BFloat16).to(Device::cuda()));
  }
}

std::vector<double> values(const Tensor& t) { return t.to(Device::cpu()).to(DType::Float64).to_vector<double>(); }

void expect_same_state(Trained& spec, Trained& decided, const std::string& at) {
  spec.opt->settle();  // the masters live in the second copies after an odd number of kept steps
  for (size_t i = 0; i < spec.params.size(); ++i) {
    expect_same_bits(spec.params[i].second, decided.params[i].second, "master " + spec.params[i].first + at);
    expect_same_bits(spec.twins[i].second, decided.twins[i].second, "twin " + spec.params[i].first + at);
  }
  const NamedTensors a = spec.opt->state_dict(), b = decided.opt->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_same_bits(a[i].second, b[i].second, a[i].first + at);
  EXPECT_EQ(spec.opt->step_count(), decided.opt->step_count()) << at;
}

class Stepper {
 public:
  Stepper() : flag_(static_cast<double*>(cuda::allocate_pinned(sizeof(double)))) { *flag_ = 0; }
  ~Stepper() { cuda::free_pinned(flag_); }

  // The trainer's decided step: the gradients' norm, the outcome, the gated update. Returns the outcome.
  std::vector<double> decided(Trained& r, float loss) {
    std::vector<Tensor> twins;
    for (const auto& [name, t] : r.twins) twins.push_back(t);
    const Tensor outcome = step_outcome(agreement(loss), grad_sum_of_squares(twins, Device::cuda()), 0);
    r.opt->set_gate(outcome.slice(kStepSkip, kGradScale + 1));
    r.opt->step();
    return values(outcome);
  }

  // The speculative step: the update, then its resolution from the squares it summed.
  std::vector<double> speculative(Trained& r, float loss) {
    r.opt->step();
    return values(r.opt->resolve(agreement(loss)));
  }

 private:
  Tensor agreement(float loss) { return step_agreement(from_vector<float>({loss}, {1}).to(Device::cuda()), 1, flag_); }
  double* flag_;
};

TEST(SpeculativeAdamW, CudaStepsEqualStepsDecidedFirstWhetherKeptOrSkipped) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Trained spec = make_run(true), decided = make_run(false);
  Stepper stepper;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<Twist, float>> steps = {
      {Twist::kNone, 1.f},    {Twist::kNanGradient, 1.f}, {Twist::kNone, 1.f},
      {Twist::kNanLoss, nan}, {Twist::kNone, 1.f},        {Twist::kNoGradient, 1.f},
      {Twist::kNone, 1.f},    {Twist::kNanGradient, 1.f}, {Twist::kNone, 1.f}};
  int64_t kept = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto [twist, loss] = steps[s];
    set_grads(spec, static_cast<int>(s), twist);
    set_grads(decided, static_cast<int>(s), twist);
    const std::vector<double> a = stepper.speculative(spec, loss), b = stepper.decided(decided, loss);
    const std::string at = " after step " + std::to_string(s);
    const bool skipped = twist == Twist::kNanGradient || twist == Twist::kNanLoss;
    EXPECT_EQ(a[kStepSkip], skipped ? 1 : 0) << at;
    EXPECT_EQ(b[kStepSkip], a[kStepSkip]) << at;
    if (std::isfinite(b[kGradNorm])) {
      EXPECT_NEAR(a[kGradNorm], b[kGradNorm], 1e-6 * b[kGradNorm]) << "the norm of the gradients read" << at;
    } else {
      EXPECT_FALSE(std::isfinite(a[kGradNorm])) << at;
    }
    kept += skipped ? 0 : 1;
    expect_same_state(spec, decided, at);
    EXPECT_EQ(spec.opt->step_count(), kept) << at;
  }
}

TEST(SpeculativeAdamW, CudaAStateSavedFromTheSecondCopiesResumesAsTheDecidedRunContinues) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Trained spec = make_run(true), decided = make_run(false);
  Stepper stepper;
  for (int s = 0; s < 3; ++s) {  // three kept steps: the second copies hold the state
    set_grads(spec, s, Twist::kNone);
    set_grads(decided, s, Twist::kNone);
    stepper.speculative(spec, 1.f);
    stepper.decided(decided, 1.f);
  }
  // A fresh run restored from what the speculative one saves (settle() makes the masters current first).
  Trained resumed = make_run(true);
  const NamedTensors saved = spec.opt->state_dict();
  resumed.opt->load_state_dict(saved);
  for (size_t i = 0; i < resumed.params.size(); ++i) {
    resumed.params[i].second.copy_(spec.params[i].second);
    resumed.twins[i].second.copy_(spec.twins[i].second);
  }
  for (int s = 3; s < 5; ++s) {
    set_grads(resumed, s, Twist::kNone);
    set_grads(decided, s, Twist::kNone);
    stepper.speculative(resumed, 1.f);
    stepper.decided(decided, 1.f);
    expect_same_state(resumed, decided, " after resumed step " + std::to_string(s));
  }
}

}  // namespace
}  // namespace dpt::optim
