// CUDA fused optimizer updates against the CPU loops (GPU machine only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/sgd.h"

namespace dpt::optim {
namespace {

// Many tensors of awkward sizes: more tensors (209) than one launch carries (kMaxTensors = 110 in
// fused_kernels.cu), so packs split across launches; sizes that are not multiples of 4 (scalar tails)
// and tensors spanning several 16384-element chunks, ending one element short of, on, and past a
// chunk boundary.
std::vector<int64_t> awkward_sizes() {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 200; ++i) sizes.push_back(1 + (i * 7919) % 3001);
  for (int64_t s : {1, 3, 5, 16383, 16384, 16385, 65537, 3 * 16384 + 7, 1000003}) sizes.push_back(s);
  return sizes;
}

struct Twin {
  NamedTensors cpu, gpu;
};

Twin make_params(uint64_t seed) {
  Generator gen(seed);
  Twin tw;
  auto sizes = awkward_sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    Tensor p = randn({sizes[i]}, gen), g = randn({sizes[i]}, gen);
    Tensor pc = p.clone(), pg = p.to(Device::cuda());
    pc.requires_grad_(true);
    pg.requires_grad_(true);
    pc.set_grad(g.clone());
    pg.set_grad(g.to(Device::cuda()));
    std::string name = "p";
    name += std::to_string(i);
    tw.cpu.emplace_back(name, pc);
    tw.gpu.emplace_back(name, pg);
  }
  return tw;
}

std::vector<float> host_floats(const Tensor& t) {
  return t.detach().to(Device::cpu()).to(DType::Float32).to_vector<float>();
}

// |gpu - cpu| <= tol * max(1, |cpu|) element by element: the CPU loops compute in double and round once,
// the fused kernels in float32, so they agree to a few float32 ulps per step.
void expect_close(const NamedTensors& cpu, const NamedTensors& gpu, double tol) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    auto x = host_floats(cpu[i].second), y = host_floats(gpu[i].second);
    ASSERT_EQ(x.size(), y.size());
    double worst = 0;
    size_t at = 0;
    for (size_t j = 0; j < x.size(); ++j) {
      const double ref = x[j];
      const double err = std::abs(ref - y[j]) / std::max(1.0, std::abs(ref));
      if (err > worst) worst = err, at = j;
    }
    EXPECT_LE(worst, tol) << cpu[i].first << " (" << x.size() << " elements) at " << at;
  }
}

// Every tensor in one group with weight decay (weight_decay_groups would exempt these 1-D tensors).
TEST(CudaOptimizers, FusedAdamWMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(1);
  AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  AdamW cpu(tw.cpu, o), gpu(tw.gpu, o);
  for (int s = 0; s < 3; ++s) {
    cpu.step();
    gpu.step();
  }
  expect_close(tw.cpu, tw.gpu, 1e-5);
}

// Adam with L2 weight decay folded into the gradient (the kernel's other branch).
TEST(CudaOptimizers, FusedAdamL2DecayMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(4);
  AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  Adam cpu(tw.cpu, o), gpu(tw.gpu, o);
  for (int s = 0; s < 3; ++s) {
    cpu.step();
    gpu.step();
  }
  expect_close(tw.cpu, tw.gpu, 1e-5);
}

TEST(CudaOptimizers, FusedSgdNesterovMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(2);
  SgdOptions o{0.05, 0.9, true, 0.01};
  SGD cpu(tw.cpu, o), gpu(tw.gpu, o);
  for (int s = 0; s < 3; ++s) {
    cpu.step();
    gpu.step();
  }
  expect_close(tw.cpu, tw.gpu, 1e-5);
}

// Without momentum the kernel gets no buffer list (null pointers).
TEST(CudaOptimizers, FusedSgdWithoutMomentumMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(5);
  SgdOptions o{0.05, 0.0, false, 0.01};
  SGD cpu(tw.cpu, o), gpu(tw.gpu, o);
  for (int s = 0; s < 3; ++s) {
    cpu.step();
    gpu.step();
  }
  expect_close(tw.cpu, tw.gpu, 1e-5);
}

TEST(CudaOptimizers, FusedGradClipMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(3);
  double a = clip_grad_norm(tw.cpu, 1.0), b = clip_grad_norm(tw.gpu, 1.0);
  EXPECT_NEAR(a, b, 1e-5 * a);
  NamedTensors gc, gg;
  for (size_t i = 0; i < tw.cpu.size(); ++i) {
    gc.emplace_back(tw.cpu[i].first, tw.cpu[i].second.grad());
    gg.emplace_back(tw.gpu[i].first, tw.gpu[i].second.grad());
  }
  expect_close(gc, gg, 1e-7);
}

// The fused kernels take 4 elements per access on tensors whose pointers are all 16-byte aligned (8 for
// bf16) and one at a time otherwise (views at odd offsets: DDP bucket views, ZeRO shards). Both paths
// must give the same bits, and both must match the CPU loops. Tensors here are views into shared
// buffers at element offsets 0 (aligned), 1, 2, 3 past a multiple of 4, or fresh (aligned) tensors.
struct Placed {
  NamedTensors params, twins;
  std::vector<Tensor> keep;  // the buffers the views live in
};

// Odd sizes around the chunk (16384) and the 4-element step, then enough small tensors that the
// views also span more than one launch's pack.
std::vector<int64_t> view_sizes() {
  std::vector<int64_t> sizes = {1, 3, 4, 5, 7, 16383, 16384, 16385, 40001, 65537, 2, 9};
  for (int i = 0; i < 120; ++i) sizes.push_back(1 + (i * 37) % 97);
  return sizes;
}

int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }

Placed place(const std::vector<int64_t>& sizes, bool as_views, bool with_twins) {
  Placed out;
  Generator gen(11);
  const int64_t total = [&] {
    int64_t n = 0;
    for (int64_t s : sizes) n += round_up4(s + 3);
    return n;
  }();
  TensorOptions f32 = TensorOptions{}.with_device(Device::cuda());
  Tensor values = randn({total}, gen).to(Device::cuda());
  Tensor pool = zeros({total}, f32), twin_pool = zeros({total}, f32.with_dtype(DType::BFloat16));
  Tensor grad_pool = zeros({total}, f32.with_dtype(with_twins ? DType::BFloat16 : DType::Float32));
  out.keep = {pool, twin_pool, grad_pool};
  int64_t offset = 0;  // a multiple of 4: the pools' allocations are aligned, so shift decides
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t shift = static_cast<int64_t>(i % 4);  // 0: aligned in the pool; 1..3: not
    const int64_t at = offset + shift, n = sizes[i];
    Tensor v = values.slice(at, at + n);
    Tensor g = randn({n}, gen).to(Device::cuda()).to(grad_pool.dtype());
    auto in_pool = [&](const Tensor& buffer, const Tensor& content) {
      Tensor t = as_views ? make_view(buffer, {n}, {1}, buffer.impl()->offset + at) : content.clone();
      if (as_views) t.copy_(content);
      return t;
    };
    Tensor p = in_pool(pool, v);
    p.requires_grad_(true);
    std::string name = "p";  // (appended, not "p" + ...: GCC 12 warns falsely on that form)
    name += std::to_string(i);
    if (with_twins) {
      Tensor tw = in_pool(twin_pool, v.to(DType::BFloat16));
      tw.requires_grad_(true);
      tw.set_grad(in_pool(grad_pool, g));
      out.twins.emplace_back(name, tw);
    } else {
      p.set_grad(in_pool(grad_pool, g));
    }
    out.params.emplace_back(name, p);
    offset += round_up4(n + 3);
  }
  return out;
}

// CPU float32 copies of the CUDA parameters with their gradients (from the twins' bf16 gradients,
// widened exactly, when there are twins: what the fused twin path reads).
NamedTensors cpu_copies(const Placed& placed) {
  NamedTensors out;
  for (size_t i = 0; i < placed.params.size(); ++i) {
    const auto& [name, p] = placed.params[i];
    Tensor q = p.detach().to(Device::cpu()).clone();
    q.requires_grad_(true);
    const Tensor& grad = placed.twins.empty() ? p.grad() : placed.twins[i].second.grad();
    q.set_grad(grad.detach().to(Device::cpu()).to(DType::Float32).clone());
    out.emplace_back(name, q);
  }
  return out;
}

void expect_same_bits(const NamedTensors& a, const NamedTensors& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = host_floats(a[i].second), y = host_floats(b[i].second);
    ASSERT_EQ(x.size(), y.size());
    for (size_t j = 0; j < x.size(); ++j) ASSERT_EQ(x[j], y[j]) << a[i].first << " element " << j;
  }
}

// float32 -> bfloat16 rounded to nearest even, widened back (finite inputs), computed here on the
// host rather than by the library's conversion so the twins are checked against a known answer.
float bf16_round(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  float y;
  std::memcpy(&y, &bits, sizeof(y));
  return y;
}

// Every twin element is exactly its float32 master rounded to bf16.
void expect_twins_are_rounded_masters(const NamedTensors& masters, const NamedTensors& twins) {
  ASSERT_EQ(masters.size(), twins.size());
  for (size_t i = 0; i < masters.size(); ++i) {
    auto m = host_floats(masters[i].second), t = host_floats(twins[i].second);
    ASSERT_EQ(m.size(), t.size());
    for (size_t j = 0; j < m.size(); ++j) ASSERT_EQ(bf16_round(m[j]), t[j]) << twins[i].first << " element " << j;
  }
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(const NamedTensors&)>;

MakeOptimizer adamw() {
  return [](const NamedTensors& params) -> std::unique_ptr<Optimizer> {
    AdamOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    return std::make_unique<AdamW>(params, o);
  };
}

MakeOptimizer sgd(double momentum, bool nesterov) {
  return [=](const NamedTensors& params) -> std::unique_ptr<Optimizer> {
    return std::make_unique<SGD>(params, SgdOptions{0.05, momentum, nesterov, 0.01});
  };
}

// Three steps on views at offsets 0..3 and on fresh tensors holding the same values: same bits.
void unaligned_views_match_aligned_tensors(const MakeOptimizer& make, bool with_twins) {
  Placed views = place(view_sizes(), true, with_twins), fresh = place(view_sizes(), false, with_twins);
  auto a = make(views.params), b = make(fresh.params);
  if (with_twins) {
    a->set_compute_twins(views.twins);
    b->set_compute_twins(fresh.twins);
  }
  for (int s = 0; s < 3; ++s) {
    a->step();
    b->step();
  }
  expect_same_bits(views.params, fresh.params);
  if (with_twins) expect_same_bits(views.twins, fresh.twins);
}

// Three steps on views at offsets 0..3 against the CPU loops on copies; twins are the rounded masters.
void unaligned_views_match_cpu(const MakeOptimizer& make, bool with_twins) {
  Placed views = place(view_sizes(), true, with_twins);
  NamedTensors ref = cpu_copies(views);
  auto gpu = make(views.params), cpu = make(ref);
  if (with_twins) gpu->set_compute_twins(views.twins);
  for (int s = 0; s < 3; ++s) {
    gpu->step();
    cpu->step();
  }
  expect_close(ref, views.params, 1e-5);
  if (with_twins) expect_twins_are_rounded_masters(views.params, views.twins);
}

TEST(CudaOptimizers, FusedAdamWOnUnalignedViewsMatchesAlignedTensors) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  unaligned_views_match_aligned_tensors(adamw(), false);
}

TEST(CudaOptimizers, FusedAdamWTwinsOnUnalignedViewsMatchAlignedTensors) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  unaligned_views_match_aligned_tensors(adamw(), true);
}

TEST(CudaOptimizers, FusedSgdOnUnalignedViewsMatchesAlignedTensors) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  unaligned_views_match_aligned_tensors(sgd(0.9, true), false);
  unaligned_views_match_aligned_tensors(sgd(0.0, false), false);
}

TEST(CudaOptimizers, FusedAdamWOnUnalignedViewsMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  unaligned_views_match_cpu(adamw(), false);
}

TEST(CudaOptimizers, FusedAdamWTwinsOnUnalignedViewsMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  unaligned_views_match_cpu(adamw(), true);
}

// Twins of fresh (aligned) tensors of the awkward sizes: the vector path's 8-byte bf16 loads and
// stores, the scalar tails, and packs split across launches, against the CPU loops.
TEST(CudaOptimizers, FusedAdamWTwinsOnAwkwardSizesMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Placed fresh = place(awkward_sizes(), false, true);
  NamedTensors ref = cpu_copies(fresh);
  auto gpu = adamw()(fresh.params), cpu = adamw()(ref);
  gpu->set_compute_twins(fresh.twins);
  for (int s = 0; s < 3; ++s) {
    gpu->step();
    cpu->step();
  }
  expect_close(ref, fresh.params, 1e-5);
  expect_twins_are_rounded_masters(fresh.params, fresh.twins);
}

TEST(CudaOptimizers, FusedSgdOnUnalignedViewsMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  unaligned_views_match_cpu(sgd(0.9, true), false);
  unaligned_views_match_cpu(sgd(0.9, false), false);
  unaligned_views_match_cpu(sgd(0.0, false), false);
}

// The norm (scalar sum of squares over packs in several launches) and the scaling (vector path on
// aligned views, scalar on the others) against the CPU on gradient views at offsets 0..3.
TEST(CudaOptimizers, FusedGradClipOnUnalignedViewsMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Placed views = place(view_sizes(), true, false);
  NamedTensors ref = cpu_copies(views);
  const double a = clip_grad_norm(ref, 1.0), b = clip_grad_norm(views.params, 1.0);
  ASSERT_GT(a, 1.0) << "the gradients must be large enough to be clipped";
  EXPECT_NEAR(a, b, 1e-5 * a);
  NamedTensors gc, gg;
  for (size_t i = 0; i < ref.size(); ++i) {
    gc.emplace_back(ref[i].first, ref[i].second.grad());
    gg.emplace_back(views.params[i].first, views.params[i].second.grad());
  }
  expect_close(gc, gg, 1e-7);
}

}  // namespace
}  // namespace dpt::optim
