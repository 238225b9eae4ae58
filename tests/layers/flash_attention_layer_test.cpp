// CausalSelfAttention with a head size the fused kernels take (D = 64): on CUDA it runs
// causal_attention (core/ops_flash_attention.h), on the CPU the composed path; both must give the same
// output and gradients (float32, so the CUDA side runs the SIMT kernels; the bf16 tensor-core kernels
// are held to the CPU by tests/core/flash_attention_test.cpp). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"
#include "layers/attention.h"

namespace dpt::nn {
namespace {

double max_relative(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    num = std::max(num, std::abs(x[i] - y[i]));
    den = std::max(den, std::abs(y[i]));
  }
  return num / den;
}

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

}  // namespace
}  // namespace dpt::nn
