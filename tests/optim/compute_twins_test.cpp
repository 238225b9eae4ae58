// Mixed precision through compute twins (the optimizer reads bf16 gradients and writes bf16 parameters
// itself) and stepping by subsets (the optimizer inside backward): both must equal the plain path
// bit for bit, since they change where the arithmetic happens, not the arithmetic.
#include <gtest/gtest.h>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/mixed_precision.h"
#include "optim/sgd.h"
#include "twin_runs.h"

namespace dpt::optim {
namespace {

using test::Masters;

Masters make_masters(Device device) {
  return test::make_masters(device, /*twins=*/true, 7,
                            {{"a.weight", {33, 17}}, {"a.bias", {17}}, {"b.weight", {5, 9}}});
}

Masters clone(const Masters& m) {
  Masters c;
  for (const auto& [name, p] : m.params) {
    Tensor q = p.detach().clone();
    q.requires_grad_(true);
    c.params.emplace_back(name, q);
  }
  for (const auto& [name, t] : m.twins) {
    Tensor q = t.detach().clone();
    q.requires_grad_(true);
    c.twins.emplace_back(name, q);
  }
  return c;
}

// bf16 gradients for step `step`, the same for both paths.
std::vector<Tensor> bf16_grads(const Masters& m, int step) {
  Generator gen(100 + static_cast<uint64_t>(step));
  std::vector<Tensor> out;
  for (const auto& [name, p] : m.params) out.push_back(randn(p.shape(), gen).to(p.device()).to(DType::BFloat16));
  return out;
}

using test::expect_same_bits;

// Reference: float32 gradients copied from the bf16 ones, the update, then masters rounded into the
// twins (what MixedPrecision's grads_to_master / masters_to_model do). Twins: the optimizer does it. With
// `clip` > 0 the reference clips its float32 gradients in place and the twins' optimizer gets the factor
// of the bf16 gradients' norm as its grad scale (how the trainer clips fused bf16 updates).
void twins_match_separate_masters(Device device, double clip = 0) {
  Masters ref = make_masters(device), fused = clone(ref);
  AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  AdamW ref_opt(weight_decay_groups(ref.params, 0.1), o), fused_opt(weight_decay_groups(fused.params, 0.1), o);
  fused_opt.set_compute_twins(fused.twins);
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> g = bf16_grads(ref, step);
    for (size_t i = 0; i < g.size(); ++i) {
      ref.params[i].second.set_grad(g[i].to(DType::Float32));
      fused.twins[i].second.set_grad(g[i].clone());
    }
    if (clip > 0) {
      std::vector<Tensor> twins;
      for (const auto& [name, t] : fused.twins) twins.push_back(t);
      const double norm = grad_norm(twins);
      EXPECT_EQ(clip_grad_norm(ref.params, clip), norm) << "the norm of the bf16 gradients read as float32";
      ASSERT_GT(norm, clip) << "the test must clip";
      fused_opt.set_grad_scale(clip_factor(norm, clip));
    }
    ref_opt.step();
    fused_opt.step();
    for (size_t i = 0; i < g.size(); ++i) {
      Tensor ref_twin = ref.params[i].second.detach().to(DType::BFloat16);
      expect_same_bits(fused.params[i].second, ref.params[i].second, "master " + ref.params[i].first);
      expect_same_bits(fused.twins[i].second, ref_twin, "twin " + ref.params[i].first);
      EXPECT_FALSE(fused.params[i].second.grad().defined()) << "masters keep no gradient of their own";
    }
  }
}

TEST(ComputeTwins, AdamThroughTwinsEqualsSeparateFloat32GradientsOnCpu) { twins_match_separate_masters(Device::cpu()); }

TEST(ComputeTwins, CudaFusedAdamThroughTwinsEqualsSeparateFloat32Gradients) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  twins_match_separate_masters(Device::cuda());
}

TEST(ComputeTwins, CudaFusedAdamThroughTwinsClipsLikeFloat32Clipping) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  twins_match_separate_masters(Device::cuda(), 1.0);
}

TEST(ComputeTwins, RejectsTwinsThatMatchNoParameter) {
  Masters m = make_masters(Device::cpu());
  AdamW opt(m.params, AdamOptions{});
  NamedTensors wrong = m.twins;
  wrong[1].first = "c.bias";
  EXPECT_THROW(opt.set_compute_twins(wrong), Error);
  NamedTensors short_list(m.twins.begin(), m.twins.end() - 1);
  EXPECT_THROW(opt.set_compute_twins(short_list), Error);
}

// A bf16 MLP trained through MixedPrecision::fuse_with equals the classic master-gradient path bit for bit.
void fused_mixed_precision_matches_classic(Device device) {
  auto train = [&](bool fused) {
    Generator gen(3);
    auto model = std::make_shared<nn::MLP>(std::vector<int64_t>{6, 16, 16, 3}, "relu", gen);
    model->to(device);
    MixedPrecision mp(model->named_parameters(), DType::BFloat16);
    AdamOptions o;
    o.lr = 1e-2;
    AdamW opt(weight_decay_groups(mp.master_params(), 0.1), o);
    if (fused) mp.fuse_with(opt);
    Generator data(4);
    Tensor x = randn({8, 6}, data).to(device).to(DType::BFloat16);
    Tensor y = randint({8}, 0, 3, data, TensorOptions{}.with_dtype(DType::Int64)).to(device);
    for (int step = 0; step < 3; ++step) {
      model->zero_grad();
      if (!fused) opt.zero_grad();
      nn::cross_entropy_loss(model->forward(x), y).backward();
      EXPECT_TRUE(mp.grads_to_master());
      opt.step();
      mp.masters_to_model();
    }
    return std::make_pair(mp.master_params(), model->named_parameters());
  };
  auto [classic_masters, classic_model] = train(false);
  auto [fused_masters, fused_model] = train(true);
  for (size_t i = 0; i < classic_masters.size(); ++i) {
    expect_same_bits(fused_masters[i].second, classic_masters[i].second, "master " + classic_masters[i].first);
    expect_same_bits(fused_model[i].second, classic_model[i].second, "model " + classic_model[i].first);
  }
}

TEST(ComputeTwins, FusedMixedPrecisionTrainsLikeMasterGradientsOnCpu) {
  fused_mixed_precision_matches_classic(Device::cpu());
}

TEST(ComputeTwins, CudaFusedMixedPrecisionTrainsLikeMasterGradients) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  fused_mixed_precision_matches_classic(Device::cuda());
}

TEST(ComputeTwins, FuseWithIsOnlyForBfloat16) {
  Generator gen(3);
  nn::MLP model(std::vector<int64_t>{4, 4}, "relu", gen);
  MixedPrecision mp(model.named_parameters(), DType::Float32);
  AdamW opt(mp.master_params(), AdamOptions{});
  EXPECT_THROW(mp.fuse_with(opt), Error);
}

// begin_step + update(subset) over disjoint subsets = step(), for Adam (state, bias correction) and SGD.
template <class Opt, class Options>
void subsets_equal_step(const Options& o) {
  Masters a = make_masters(Device::cpu()), b = clone(a);
  Opt whole(a.params, o), pieces(b.params, o);
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> g = bf16_grads(a, step);
    for (size_t i = 0; i < g.size(); ++i) {
      a.params[i].second.set_grad(g[i].to(DType::Float32));
      b.params[i].second.set_grad(g[i].to(DType::Float32));
    }
    whole.step();
    pieces.begin_step();
    pieces.update({b.params[2].second});
    pieces.update({b.params[0].second, b.params[1].second});
    for (size_t i = 0; i < g.size(); ++i) expect_same_bits(b.params[i].second, a.params[i].second, a.params[i].first);
  }
  EXPECT_EQ(pieces.step_count(), whole.step_count());
}

TEST(OptimizerSubsets, AdamUpdatedBySubsetsEqualsOneStep) {
  AdamOptions o;
  o.lr = 1e-2;
  subsets_equal_step<AdamW>(o);
}

TEST(OptimizerSubsets, SgdWithMomentumUpdatedBySubsetsEqualsOneStep) {
  SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  subsets_equal_step<SGD>(o);
}

TEST(OptimizerSubsets, UpdateRejectsForeignTensorsAndNeedsBeginStep) {
  Masters m = make_masters(Device::cpu());
  AdamW opt(m.params, AdamOptions{});
  EXPECT_THROW(opt.update({m.params[0].second}), Error);  // no begin_step yet
  opt.begin_step();
  EXPECT_THROW(opt.update({zeros({2})}), Error);
}

}  // namespace
}  // namespace dpt::optim
