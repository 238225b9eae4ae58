// The fast paths of the memory-bound kernels, against the CPU kernels: LayerNorm's warp-per-row
// kernels (every instantiated vector count, one row, many rows, rows that fall back: odd widths, widths
// not a multiple of the vector, misaligned rows, float32 weights under bfloat16 input), the tiled
// transposing copy, the vectorised column reduction, and concatenation of equal parts along an inner dim
// (split's backward), which also runs on the CPU.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/op_helpers.h"
#include "core/ops.h"
#include "core/ops_norm.h"
#include "max_relative.h"

using namespace dpt;

namespace {

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return 1e-12;
    case DType::Float32:
      return 1e-5;
    default:
      return 1e-2;
  }
}

// y, grad x, grad weight, grad bias of layer_norm on `device`; x may be any (contiguous) view.
std::vector<Tensor> layer_norm_run(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& g, Device d) {
  Tensor xd = x.to(d).detach().requires_grad_(), wd = w.to(d).detach().requires_grad_(),
         bd = b.to(d).detach().requires_grad_();
  Tensor y = layer_norm(xd, wd, bd, 1e-5);
  y.backward(g.to(d));
  return {y.to(Device::cpu()), xd.grad().to(Device::cpu()), wd.grad().to(Device::cpu()), bd.grad().to(Device::cpu())};
}

void expect_layer_norm_parity(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& g,
                              const std::string& what) {
  auto cpu = layer_norm_run(x, w, b, g, Device::cpu());
  auto gpu = layer_norm_run(x, w, b, g, Device::cuda(0));
  const char* names[] = {"y", "grad x", "grad weight", "grad bias"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_LT(max_relative(gpu[i], cpu[i]), tolerance(x.dtype())) << names[i] << " " << what;
  }
}

}  // namespace

TEST(CudaLayerNormPaths, WarpRowsMatchCpuForEveryVectorCountAndRowCount) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    DType dtype;
    int64_t n;
  };
  // bf16 rows of 8 (1 vector per lane ... 8): 8, 768 (3), 1024 (4), 1280 (5 -> 6), 2048 (8); float32
  // rows of 4; float64 rows of 2. 2056 bf16 is past the register path and falls back.
  const std::vector<Case> cases = {{DType::BFloat16, 8},    {DType::BFloat16, 256},  {DType::BFloat16, 768},
                                   {DType::BFloat16, 1024}, {DType::BFloat16, 1280}, {DType::BFloat16, 2048},
                                   {DType::BFloat16, 2056}, {DType::Float32, 4},     {DType::Float32, 768},
                                   {DType::Float32, 1024},  {DType::Float64, 64},    {DType::Float64, 512}};
  for (const auto& c : cases) {
    for (int64_t rows : {1, 9, 70, 1500}) {
      Generator gen(7 + c.n + rows);
      TensorOptions opts = TensorOptions{}.with_dtype(c.dtype);
      Tensor x = randn({rows, c.n}, gen, opts, 0.5, 2.0), w = randn({c.n}, gen, opts), b = randn({c.n}, gen, opts);
      Tensor g = randn({rows, c.n}, gen, opts);
      expect_layer_norm_parity(
          x, w, b, g,
          std::string(dtype_name(c.dtype)) + " [" + std::to_string(rows) + ", " + std::to_string(c.n) + "]");
    }
  }
}

TEST(CudaLayerNormPaths, FallbackRowsMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // Odd widths, widths that are not a multiple of the 16-byte vector, and a 3-d input (one feature: below).
  for (DType dtype : {DType::BFloat16, DType::Float32}) {
    for (int64_t n : {3, 37, 100, 770}) {
      Generator gen(3 + n);
      TensorOptions opts = TensorOptions{}.with_dtype(dtype);
      Tensor x = randn({2, 35, n}, gen, opts), w = randn({n}, gen, opts), b = randn({n}, gen, opts);
      Tensor g = randn({2, 35, n}, gen, opts);
      expect_layer_norm_parity(x, w, b, g, std::string(dtype_name(dtype)) + " n=" + std::to_string(n));
    }
  }
}

// One feature: every x_hat is 0, so y = bias, the weight gradient is 0 and the bias gradient sums g.
// The input gradient is 0 in exact arithmetic; in floats it is rounding noise times 1/sqrt(eps) (316),
// so it gets an absolute bound instead of the relative parity measure (whose reference is all zeros).
TEST(CudaLayerNormPaths, OneFeatureRowsHaveKnownAnswers) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Generator gen(4);
  Tensor x = randn({2, 35, 1}, gen), w = randn({1}, gen), b = randn({1}, gen), g = randn({2, 35, 1}, gen);
  auto out = layer_norm_run(x, w, b, g, Device::cuda(0));
  const double bias = b.item(), g_sum = sum(g).item();
  for (double y : out[0].to_vector<double>()) EXPECT_NEAR(y, bias, 1e-6);
  for (double dx : out[1].to_vector<double>()) EXPECT_NEAR(dx, 0.0, 1e-3);
  EXPECT_NEAR(out[2].item(), 0.0, 1e-6);
  EXPECT_NEAR(out[3].item(), g_sum, 1e-4);
}

TEST(CudaLayerNormPaths, MisalignedRowsAndFloat32WeightsMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 40, n = 768;
  Generator gen(5);
  TensorOptions bf = TensorOptions{}.with_dtype(DType::BFloat16);
  // Rows starting one element past a 16-byte boundary: contiguous, but not vector-aligned on the GPU.
  Tensor flat = randn({rows * n + 1}, gen, bf);
  Tensor g = randn({rows, n}, gen, bf);
  Tensor w = randn({n}, gen, bf), b = randn({n}, gen, bf);
  auto misaligned = [&](Device d) {
    Tensor fd = flat.to(d);
    return fd.slice(1, rows * n + 1).reshape({rows, n});
  };
  {
    Tensor xd = misaligned(Device::cuda(0)).detach().requires_grad_();
    Tensor wd = w.to(Device::cuda(0)).detach().requires_grad_(), bd = b.to(Device::cuda(0)).detach().requires_grad_();
    Tensor y = layer_norm(xd, wd, bd, 1e-5);
    y.backward(g.to(Device::cuda(0)));
    auto cpu = layer_norm_run(misaligned(Device::cpu()), w, b, g, Device::cpu());
    EXPECT_LT(max_relative(y.to(Device::cpu()), cpu[0]), 1e-2);
    EXPECT_LT(max_relative(xd.grad().to(Device::cpu()), cpu[1]), 1e-2);
    EXPECT_LT(max_relative(wd.grad().to(Device::cpu()), cpu[2]), 1e-2);
    EXPECT_LT(max_relative(bd.grad().to(Device::cpu()), cpu[3]), 1e-2);
  }
  // bfloat16 activations with float32 parameters (mixed-precision masters).
  Tensor x = randn({rows, n}, gen, bf);
  Tensor w32 = randn({n}, gen), b32 = randn({n}, gen);
  expect_layer_norm_parity(x, w32, b32, g, "bf16 input, f32 weights");
}

TEST(CudaLayerNormPaths, BackwardIsBitwiseDeterministic) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // float32 768 sums its columns in registers, bf16 1536 in shared memory; 9000 rows walk several a warp.
  for (auto [dtype, n] : {std::pair{DType::Float32, int64_t{768}}, std::pair{DType::BFloat16, int64_t{1536}}}) {
    Generator gen(9);
    TensorOptions opts = TensorOptions{}.with_dtype(dtype);
    Tensor x = randn({9000, n}, gen, opts), w = randn({n}, gen, opts), b = randn({n}, gen, opts);
    Tensor g = randn({9000, n}, gen, opts);
    auto first = layer_norm_run(x, w, b, g, Device::cuda(0));
    auto second = layer_norm_run(x, w, b, g, Device::cuda(0));
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(first[i].to(DType::Float32).to_vector<float>(), second[i].to(DType::Float32).to_vector<float>())
          << dtype_name(dtype) << " output " << i;
    }
  }
}

TEST(CudaCopyPaths, TransposedAndPermutedCopiesMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    Shape shape;
    std::vector<int64_t> perm;
  };
  // Unit stride moved off the last dim (2-d transposes of odd and tile-multiple sizes, a batched
  // transpose, concat's dim-to-front move), and one that keeps it (the head split).
  const std::vector<Case> cases = {{{64, 96}, {1, 0}},
                                   {{1, 1}, {1, 0}},
                                   {{33, 17}, {1, 0}},
                                   {{1000, 3}, {1, 0}},
                                   {{3, 1000}, {1, 0}},
                                   {{5, 70, 45}, {0, 2, 1}},
                                   {{4, 6, 40, 8}, {3, 0, 1, 2}},
                                   {{2, 3, 4, 8}, {0, 2, 1, 3}},
                                   {{7, 9, 11}, {2, 1, 0}}};
  for (DType dtype : {DType::BFloat16, DType::Float32, DType::Float64}) {
    for (const auto& c : cases) {
      Generator gen(21);
      Tensor x = randn(c.shape, gen, TensorOptions{}.with_dtype(dtype));
      Tensor want = x.permute(c.perm).contiguous();
      Tensor got = x.to(Device::cuda(0)).permute(c.perm).contiguous().to(Device::cpu());
      ASSERT_EQ(got.shape(), want.shape());
      EXPECT_EQ(got.to_vector<double>(), want.to_vector<double>()) << dtype_name(dtype) << " " << shape_str(c.shape);
    }
  }
  // With a dtype conversion on the way (float32 source, bfloat16 destination).
  Generator gen(22);
  Tensor x = randn({130, 70}, gen);
  Tensor want = Tensor::empty({70, 130}, TensorOptions{}.with_dtype(DType::BFloat16));
  kernels::copy_strided(x.transpose(0, 1), want);
  Tensor xd = x.to(Device::cuda(0));
  Tensor got = Tensor::empty({70, 130}, TensorOptions{}.with_dtype(DType::BFloat16).with_device(Device::cuda(0)));
  kernels::copy_strided(xd.transpose(0, 1), got);
  EXPECT_EQ(got.to(Device::cpu()).to_vector<double>(), want.to_vector<double>());
}

TEST(CudaReducePaths, ColumnSumsMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // [rows, cols] summed over rows (the bias gradient): vector-friendly and odd column counts, one row.
  const std::vector<Shape> shapes = {{3000, 768}, {1, 768}, {513, 37}, {4096, 3}, {2, 5, 24}};
  for (DType dtype : {DType::BFloat16, DType::Float32, DType::Float64}) {
    for (const Shape& shape : shapes) {
      Generator gen(31);
      Tensor x = randn(shape, gen, TensorOptions{}.with_dtype(dtype));
      Tensor want = sum(x, shape.size() == 3 ? 1 : 0);
      Tensor got = sum(x.to(Device::cuda(0)), shape.size() == 3 ? 1 : 0).to(Device::cpu());
      EXPECT_LT(max_relative(got, want), dtype == DType::BFloat16 ? 1e-2 : 1e-6)
          << dtype_name(dtype) << " " << shape_str(shape);
    }
  }
}

TEST(ConcatEqualParts, InnerDimMatchesElementwiseDefinition) {
  // Equal parts along the last and a middle dim take the stacked path; unequal ones the general one.
  Generator gen(41);
  for (int64_t dim : {0, 1, 2}) {
    for (bool equal : {true, false}) {
      std::vector<Tensor> parts;
      for (int64_t i = 0; i < 3; ++i) {
        Shape s = {2, 3, 8};
        if (!equal) s[dim] += i;
        parts.push_back(randn(s, gen));
      }
      Tensor out = concat(parts, dim);
      auto vo = out.to_vector<float>();
      const Shape& os = out.shape();
      int64_t start = 0;
      for (const Tensor& p : parts) {
        auto vp = p.to_vector<float>();
        const Shape& ps = p.shape();
        for (int64_t a = 0; a < ps[0]; ++a) {
          for (int64_t b = 0; b < ps[1]; ++b) {
            for (int64_t c = 0; c < ps[2]; ++c) {
              int64_t idx[3] = {a, b, c};
              idx[dim] += start;
              const float want = vp[static_cast<size_t>((a * ps[1] + b) * ps[2] + c)];
              EXPECT_EQ(vo[static_cast<size_t>((idx[0] * os[1] + idx[1]) * os[2] + idx[2])], want)
                  << "dim " << dim << (equal ? " equal" : " unequal");
            }
          }
        }
        start += ps[dim];
      }
    }
  }
}

TEST(ConcatEqualParts, SplitBackwardOfFusedQkvGivesEachPartItsGradient) {
  // split(qkv) along the last dim, each part weighted differently; parts' gradients land side by side.
  for (bool gpu : {false, true}) {
    if (gpu && !cuda::is_available()) continue;
    const Device d = gpu ? Device::cuda(0) : Device::cpu();
    Generator gen(43);
    Tensor x = randn({2, 5, 3 * 16}, gen, TensorOptions{}.with_dtype(DType::BFloat16).with_device(d));
    x = x.detach().requires_grad_();
    std::vector<Tensor> p = split(x, {16, 16, 16}, 2);
    // Views of the parts through the same reshape/permute attention uses, back to [B, T, C].
    Tensor loss = sum(p[0] * 1.0) + sum(p[1] * 2.0) + sum(p[2].reshape({2, 5, 2, 8}).permute({0, 2, 1, 3}) * 3.0);
    loss.backward();
    auto gv = x.grad().to(Device::cpu()).to_vector<float>();
    for (size_t i = 0; i < gv.size(); ++i) {
      const float want = static_cast<float>(1 + (i % 48) / 16);
      ASSERT_EQ(gv[i], want) << (gpu ? "cuda" : "cpu") << " element " << i;
    }
  }
}
