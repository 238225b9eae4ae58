// CausalSelfAttention with a head size the fused kernels take (D = 64): on CUDA it runs
// causal_attention_qkv (core/ops_flash_attention.h), on the CPU the composed path; both must give the
// same output and gradients (float32, so the CUDA side composes the op; the bf16 kernels are held to the
// CPU by tests/core/flash_attention_test.cpp and flash_attention_qkv_test.cpp). In bfloat16 the layer
// runs the packed mma kernels, held to the composition it replaced, built from the layer's own qkv and
// proj modules, and, with attention dropout, to the composed path DPT_ATTENTION=reference selects.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/flags.h"
#include "core/max_relative.h"
#include "core/ops.h"
#include "core/ops_flash_attention.h"
#include "layers/attention.h"

namespace dpt::nn {
namespace {

TEST(CudaFlashAttentionLayer, FusedCudaPathMatchesComposedCpuPath) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator g1(31), g2(31), gen(32);
  CausalSelfAttention cpu(128, 2, 0.0, g1), gpu(128, 2, 0.0, g2);  // D = 64
  gpu.to(Device::cuda());
  Tensor xc = randn({2, 77, 128}, gen).requires_grad_();
  Tensor xg = xc.detach().to(Device::cuda()).requires_grad_();
  Tensor yc = cpu.forward(xc), yg = gpu.forward(xg);
  EXPECT_LT(max_relative(yg, yc), 1e-4) << "forward";
  Tensor w = rand(yc.shape(), gen, {}, 0.5, 1.5);
  sum(yc * w).backward();
  sum(yg * w.to(Device::cuda())).backward();
  EXPECT_LT(max_relative(xg.grad(), xc.grad()), 1e-4) << "input gradient";
  auto pc = cpu.named_parameters(), pg = gpu.named_parameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_LT(max_relative(pg[i].second.grad(), pc[i].second.grad()), 1e-4) << pc[i].first;
  }
}

// The layer's fused bfloat16 branch (causal_attention_qkv on the packed projection) against the path
// it replaced, composed explicitly from the same modules: qkv, split into heads, causal_attention,
// heads merged, proj. The attention is bitwise the same (tests/core/flash_attention_qkv_test.cpp); the
// tolerance leaves room only for the cuBLAS GEMMs around it, which see the same operands.
TEST(CudaFlashAttentionLayer, PackedQkvPathMatchesExplicitCompositionInBfloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ScopedFlag mma_forward(Flag::Attention, "flash");  // the fused branch's forward on our kernels, as the composition's
  Generator g1(33), gen(34);
  const int64_t n_embd = 192, n_head = 3, head = n_embd / n_head, b = 2, t = 200;  // D = 64
  CausalSelfAttention layer(n_embd, n_head, 0.0, g1);
  layer.to(Device::cuda());
  layer.to(DType::BFloat16);
  const TensorOptions bf16 = TensorOptions{}.with_dtype(DType::BFloat16);
  Tensor x = randn({b, t, n_embd}, gen, bf16).to(Device::cuda()),
         w = randn({b, t, n_embd}, gen, bf16).to(Device::cuda());
  const double scale = 1.0 / std::sqrt(static_cast<double>(head));
  auto composed = [&](const Tensor& in) {
    std::vector<Tensor> parts = split(layer.qkv->forward(in), {n_embd, n_embd, n_embd}, 2);
    auto heads = [&](const Tensor& p) { return p.reshape({b, t, n_head, head}).permute({0, 2, 1, 3}); };
    Tensor y = causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), scale);
    return layer.proj->forward(y.permute({0, 2, 1, 3}).reshape({b, t, n_embd}));
  };
  // Output, input gradient and parameter gradients of sum(y * w) for one of the two paths.
  auto run = [&](bool fused) {
    layer.zero_grad();
    Tensor xl = x.detach().clone().requires_grad_();
    Tensor y = fused ? layer.forward(xl) : composed(xl);
    sum(y * w).backward();
    std::vector<Tensor> out{y.detach().to(Device::cpu()), xl.grad().to(Device::cpu())};
    for (auto& [name, p] : layer.named_parameters()) out.push_back(p.grad().to(Device::cpu()));
    return out;
  };
  std::vector<Tensor> fused = run(true), ref = run(false);
  ASSERT_EQ(fused.size(), ref.size());
  auto names = layer.named_parameters();
  for (size_t i = 0; i < fused.size(); ++i) {
    const std::string what = i == 0 ? "output" : i == 1 ? "input gradient" : names[i - 2].first;
    EXPECT_EQ(fused[i].dtype(), DType::BFloat16) << what;
    EXPECT_LT(max_relative(fused[i], ref[i]), 1e-2) << what;
  }
}

// Attention dropout drawn inside our mma kernels against the layer's composed path (DPT_ATTENTION=reference:
// scores, softmax, dpt::dropout on the [B, H, T, T] weights, matmul), both on the GPU in bfloat16 from the
// same weights and generator state, so both draw the same mask. A mask that differed would move values by
// whole weights, far beyond the tolerance, which leaves room for the composed path's bfloat16 scores.
TEST(CudaFlashAttentionLayer, FusedDropoutMatchesTheReferencePathInBfloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator g1(35), g2(35), gen(36);
  const int64_t n_embd = 128, n_head = 2, b = 2, t = 80;  // D = 64; T no multiple of the tiles
  CausalSelfAttention fused(n_embd, n_head, 0.3, g1), composed(n_embd, n_head, 0.3, g2);
  for (CausalSelfAttention* layer : {&fused, &composed}) {
    layer->to(Device::cuda());
    layer->to(DType::BFloat16);
  }
  const TensorOptions bf16 = TensorOptions{}.with_dtype(DType::BFloat16).with_device(Device::cuda());
  Tensor x = randn({b, t, n_embd}, gen, bf16), w = randn({b, t, n_embd}, gen, bf16);
  // Output, input gradient and parameter gradients of sum(y * w).
  auto run = [&](CausalSelfAttention& layer) {
    Tensor xl = x.detach().clone().requires_grad_();
    Tensor y = layer.forward(xl);
    sum(y * w).backward();
    std::vector<Tensor> out{y.detach().to(Device::cpu()), xl.grad().to(Device::cpu())};
    for (auto& [name, p] : layer.named_parameters()) out.push_back(p.grad().to(Device::cpu()));
    return out;
  };
  ASSERT_TRUE(causal_attention_dropout_fused(Tensor::empty({b, t, 3 * n_embd}, bf16), n_head));
  std::vector<Tensor> got, want;
  {
    ScopedFlag ours(Flag::Attention, "flash");  // cuDNN's engines draw their own mask (sdpa_cudnn_test.cpp)
    got = run(fused);
  }
  {
    ScopedFlag reference(Flag::Attention, "reference");
    ASSERT_FALSE(causal_attention_dropout_fused(Tensor::empty({b, t, 3 * n_embd}, bf16), n_head));
    want = run(composed);
  }
  ASSERT_EQ(got.size(), want.size());
  auto names = fused.named_parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string what = i == 0 ? "output" : i == 1 ? "input gradient" : names[i - 2].first;
    EXPECT_LT(max_relative(got[i], want[i]), 3e-2) << what;
  }
}

}  // namespace
}  // namespace dpt::nn
