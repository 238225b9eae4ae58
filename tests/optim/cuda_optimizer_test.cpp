// CUDA fused optimizer updates against the CPU loops (GPU machine only).
#include <gtest/gtest.h>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/sgd.h"

namespace dpt::optim {
namespace {

// Many tensors of awkward sizes, including ones spanning several chunks and more tensors and chunks
// than one launch holds, so the multi-tensor packing is exercised across launch boundaries.
std::vector<int64_t> awkward_sizes() {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 150; ++i) sizes.push_back(1 + (i * 7919) % 3001);
  sizes.push_back(65536 * 700 + 13);  // > 640 chunks: splits inside one tensor
  sizes.push_back(65536);
  sizes.push_back(1);
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

void expect_close(const NamedTensors& a, const NamedTensors& b, double tol) {
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].second.to_vector<float>(), y = b[i].second.to_vector<float>();
    ASSERT_EQ(x.size(), y.size());
    double worst = 0;
    for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, static_cast<double>(std::abs(x[j] - y[j])));
    EXPECT_LE(worst, tol) << a[i].first;
  }
}

TEST(CudaOptimizers, FusedAdamWMatchesCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Twin tw = make_params(1);
  AdamOptions o;
  o.lr = 1e-2;
  AdamW cpu(weight_decay_groups(tw.cpu, 0.1), o), gpu(weight_decay_groups(tw.gpu, 0.1), o);
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

// The fused Adam takes 4 elements per access on tensors whose pointers are 16-byte aligned (8 for bf16)
// and one at a time otherwise (views at odd offsets: DDP bucket views, ZeRO shards). Both paths must
// give the same bits: the same parameters as views at offsets 0..3 into a shared buffer and as fresh
// (aligned) tensors, updated three times, with and without bf16 compute twins.
struct Placed {
  NamedTensors params, twins;
  std::vector<Tensor> keep;  // the buffers the views live in
};

Placed place(const std::vector<int64_t>& sizes, bool as_views, bool with_twins) {
  Placed out;
  Generator gen(11);
  const int64_t total = [&] {
    int64_t n = 0;
    for (int64_t s : sizes) n += s + 3;
    return n;
  }();
  TensorOptions f32 = TensorOptions{}.with_device(Device::cuda());
  Tensor values = randn({total}, gen).to(Device::cuda());
  Tensor pool = zeros({total}, f32), twin_pool = zeros({total}, f32.with_dtype(DType::BFloat16));
  Tensor grad_pool = zeros({total}, f32.with_dtype(with_twins ? DType::BFloat16 : DType::Float32));
  out.keep = {pool, twin_pool, grad_pool};
  int64_t offset = 0;
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
    offset += n + 3;
  }
  return out;
}

void expect_same_bits(const NamedTensors& a, const NamedTensors& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].second.to(Device::cpu()).to(DType::Float32).to_vector<float>();
    auto y = b[i].second.to(Device::cpu()).to(DType::Float32).to_vector<float>();
    ASSERT_EQ(x.size(), y.size());
    for (size_t j = 0; j < x.size(); ++j) ASSERT_EQ(x[j], y[j]) << a[i].first << " element " << j;
  }
}

void unaligned_views_match_aligned_tensors(bool with_twins) {
  const std::vector<int64_t> sizes = {1, 3, 4, 5, 7, 16383, 16384, 16385, 40001, 65537, 2, 9};
  Placed views = place(sizes, true, with_twins), fresh = place(sizes, false, with_twins);
  AdamOptions o;
  o.lr = 1e-2;
  AdamW a(weight_decay_groups(views.params, 0.1), o), b(weight_decay_groups(fresh.params, 0.1), o);
  if (with_twins) {
    a.set_compute_twins(views.twins);
    b.set_compute_twins(fresh.twins);
  }
  for (int s = 0; s < 3; ++s) {
    a.step();
    b.step();
  }
  expect_same_bits(views.params, fresh.params);
  if (with_twins) expect_same_bits(views.twins, fresh.twins);
}

TEST(CudaOptimizers, FusedAdamWOnUnalignedViewsMatchesAlignedTensors) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  unaligned_views_match_aligned_tensors(false);
}

TEST(CudaOptimizers, FusedAdamWTwinsOnUnalignedViewsMatchAlignedTensors) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  unaligned_views_match_aligned_tensors(true);
}

}  // namespace
}  // namespace dpt::optim
