// float16 (IEEE binary16): conversions round to nearest even with overflow to infinity and gradual
// underflow through the subnormals, tensors of every dtype convert to and from it, fills and random
// draws round once, safetensors stores it as "F16"; on a GPU the device conversions, matmul, layer
// norm, cross-entropy and attention agree with the CPU (those skip without a GPU).
#include "core/float16.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/ops_flash_attention.h"
#include "core/ops_norm.h"
#include "core/safetensors.h"
#include "max_relative.h"

namespace dpt {
namespace {

const TensorOptions kF16 = TensorOptions{}.with_dtype(DType::Float16);
const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

uint16_t bits_of(float f) { return f16(f).bits; }

float from_bits(uint16_t b) {
  f16 h;
  h.bits = b;
  return static_cast<float>(h);
}

TEST(Float16Conversion, KnownValuesHaveTheirIeeeBitPatterns) {
  EXPECT_EQ(bits_of(0.0f), 0x0000);
  EXPECT_EQ(bits_of(-0.0f), 0x8000);
  EXPECT_EQ(bits_of(1.0f), 0x3c00);
  EXPECT_EQ(bits_of(-2.0f), 0xc000);
  EXPECT_EQ(bits_of(0.5f), 0x3800);
  EXPECT_EQ(bits_of(65504.0f), 0x7bff);                  // largest finite
  EXPECT_EQ(bits_of(1.0f / 3.0f), 0x3555);               // 0.333251953125
  EXPECT_EQ(bits_of(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(bits_of(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(bits_of(std::ldexp(3.0f, -24)), 0x0003);     // subnormal, exact
  EXPECT_EQ(bits_of(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(bits_of(-std::ldexp(5.0f, -24)), 0x8005);
  EXPECT_EQ(from_bits(0x3555), 0.333251953125f);
  EXPECT_EQ(from_bits(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(from_bits(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(from_bits(0x7bff), 65504.0f);
  EXPECT_EQ(from_bits(0xfc00), -std::numeric_limits<float>::infinity());
}

TEST(Float16Conversion, RoundsToNearestEvenIncludingSubnormalsAndOverflow) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even mantissa.
  EXPECT_EQ(static_cast<float>(f16(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(static_cast<float>(f16(1.0f + std::ldexp(3.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(static_cast<float>(f16(1.0f + std::ldexp(1.1f, -11))), 1.0f + std::ldexp(1.0f, -10));
  // Below the smallest subnormal: 2^-25 is a tie between 0 and 2^-24 (even: 0); a bit more rounds up.
  EXPECT_EQ(bits_of(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(bits_of(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(bits_of(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 subnormal units: tie, even is 2
  EXPECT_EQ(bits_of(1e-10f), 0x0000);
  EXPECT_EQ(bits_of(-1e-10f), 0x8000);
  // Just below 2^-14 rounds up into the smallest normal.
  EXPECT_EQ(bits_of(std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x0400);
  // 65519.99 still rounds to 65504; 65520 is the tie with 65536 (even: infinity).
  EXPECT_EQ(bits_of(65519.0f), 0x7bff);
  EXPECT_EQ(bits_of(65520.0f), 0x7c00);
  EXPECT_EQ(bits_of(1e6f), 0x7c00);
  EXPECT_EQ(bits_of(-1e6f), 0xfc00);
  EXPECT_EQ(bits_of(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(static_cast<float>(f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Float16Conversion, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = from_bits(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(f16(f)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(bits_of(f), b) << std::hex << b << " -> " << f;
  }
}

#ifdef __FLT16_MAX__
// The compiler's own _Float16 (IEEE conversion in hardware or libgcc) as an independent reference for
// random floats across the whole range, including the overflow and subnormal regions.
TEST(Float16Conversion, MatchesTheCompilersFloat16OnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> exponent(100, 150), mantissa(0, (1u << 23) - 1), sign(0, 1);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = (sign(rng) << 31) | (exponent(rng) << 23) | mantissa(rng);
    float f;
    std::memcpy(&f, &u, sizeof(f));
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, sizeof(ref_bits));
    ASSERT_EQ(bits_of(f), ref_bits) << f;
  }
}
#endif

TEST(Float16Tensor, DtypeNameSizeAndParsing) {
  EXPECT_EQ(dtype_size(DType::Float16), 2u);
  EXPECT_STREQ(dtype_name(DType::Float16), "float16");
  EXPECT_TRUE(is_floating(DType::Float16));
  for (const char* name : {"float16", "fp16", "f16", "half"}) EXPECT_EQ(parse_dtype(name), DType::Float16) << name;
  EXPECT_STREQ(safetensors_dtype_name(DType::Float16), "F16");
}

TEST(Float16Tensor, CastsToAndFromEveryDtype) {
  // Values exact in float16 survive every floating dtype and back.
  const std::vector<double> exact{-2.5, 0, 1, 3.25, 1024, 65504, std::ldexp(1.0, -24), -std::ldexp(7.0, -20)};
  Tensor h = from_vector(exact, {8}, kF64).to(DType::Float16);
  EXPECT_EQ(h.dtype(), DType::Float16);
  EXPECT_EQ(h.to_vector<double>(), exact);
  for (DType d : {DType::Float32, DType::Float64}) {
    EXPECT_EQ(h.to(d).to(DType::Float16).to_vector<double>(), exact) << dtype_name(d);
  }
  // bfloat16 keeps only 8 significant bits: 3.25 and 1024 are exact in both, 65504 is not.
  Tensor small = from_vector(std::vector<double>{-2.5, 0, 1, 3.25, 1024}, {5}, kF64).to(DType::Float16);
  EXPECT_EQ(small.to(DType::BFloat16).to(DType::Float16).to_vector<double>(), small.to_vector<double>());
  // Integers both ways; float16 -> int truncates toward zero, as every float -> int conversion here.
  Tensor ints = from_vector(std::vector<int64_t>{-7, 0, 2048, 2049}, {4}, TensorOptions{}.with_dtype(DType::Int64));
  EXPECT_EQ(ints.to(DType::Float16).to_vector<double>(), (std::vector<double>{-7, 0, 2048, 2048}));  // 2049: tie
  EXPECT_EQ(
      from_vector(std::vector<double>{-2.75, 3.5}, {2}, kF64).to(DType::Float16).to(DType::Int32).to_vector<int32_t>(),
      (std::vector<int32_t>{-2, 3}));
  // Overflow and underflow in a cast.
  Tensor extreme = from_vector(std::vector<double>{1e5, -1e5, 1e-9}, {3}, kF64).to(DType::Float16);
  std::vector<double> e = extreme.to_vector<double>();
  EXPECT_TRUE(std::isinf(e[0]) && e[0] > 0);
  EXPECT_TRUE(std::isinf(e[1]) && e[1] < 0);
  EXPECT_EQ(e[2], 0.0);
}

TEST(Float16Tensor, FillsArangeAndRandomDrawsRoundOnce) {
  EXPECT_EQ(full({3}, 0.1, kF16).to_vector<float>(), std::vector<float>(3, static_cast<float>(f16(0.1f))));
  EXPECT_EQ(arange(4, kF16).to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  Generator a(5), b(5);
  Tensor h = randn({257}, a, kF16), f = randn({257}, b);
  std::vector<float> hv = h.to_vector<float>(), fv = f.to_vector<float>();
  for (size_t i = 0; i < hv.size(); ++i) ASSERT_EQ(hv[i], static_cast<float>(f16(fv[i]))) << i;
  Generator c(6);
  std::vector<float> u = rand({1000}, c, kF16, -1.0, 1.0).to_vector<float>();
  for (float x : u) ASSERT_TRUE(x >= -1.0f && x <= 1.0f) << x;
}

TEST(Float16Tensor, SafetensorsStoresF16) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dpt_float16_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  Tensor h = from_vector(std::vector<double>{1.5, -2.0, 65504, std::ldexp(1.0, -24)}, {2, 2}, kF64).to(DType::Float16);
  save_safetensors(path, {{"h", h}});
  SafetensorsContents loaded = load_safetensors(path);
  std::filesystem::remove(path);
  const Tensor& back = loaded.at("h");
  EXPECT_EQ(back.dtype(), DType::Float16);
  EXPECT_EQ(back.shape(), (Shape{2, 2}));
  EXPECT_EQ(back.to_vector<double>(), h.to_vector<double>());
}

// --- on a GPU -------------------------------------------------------------------------------------

#define SKIP_WITHOUT_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// __float2half_rn on the device and dpt::f16 on the host give the same bits: every float16 value, the
// midpoints between neighbours (ties), and values past the ends of the range.
TEST(CudaFloat16, DeviceConversionsMatchTheHostBitForBit) {
  SKIP_WITHOUT_GPU();
  std::vector<float> values;
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    const float lo = from_bits(static_cast<uint16_t>(b)), hi = from_bits(static_cast<uint16_t>(b + 1));
    values.push_back(lo);
    values.push_back(-lo);
    values.push_back(0.5f * (lo + hi));  // exact in float: the tie
  }
  for (float f : {65519.0f, 65520.0f, 1e6f, -1e6f, 1e-10f, std::ldexp(1.0f, -25)}) values.push_back(f);
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor host = from_vector(values, {n});
  Tensor on_gpu = host.to(Device::cuda(0)).to(DType::Float16).to(Device::cpu());
  Tensor on_cpu = host.to(DType::Float16);
  const f16* g = on_gpu.data<f16>();
  const f16* c = on_cpu.data<f16>();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g[i].bits, c[i].bits) << "value " << values[static_cast<size_t>(i)];
  // And back to float32 on the device.
  Tensor widened = on_cpu.to(Device::cuda(0)).to(DType::Float32).to(Device::cpu());
  EXPECT_EQ(widened.to_vector<float>(), on_cpu.to(DType::Float32).to_vector<float>());
}

// The ops float16 training leans on, forward and backward, CUDA against the CPU in float16.
TEST(CudaFloat16, MatmulLayerNormCrossEntropyAndAttentionMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  Generator gen(31);
  auto leaf = [](const Tensor& t, Device d) { return t.to(d).detach().requires_grad_(); };
  auto grads_match = [](const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu, double tol,
                        const std::string& what) {
    ASSERT_EQ(gpu.size(), cpu.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
      EXPECT_EQ(gpu[i].dtype(), cpu[i].dtype()) << what << " " << i;
      EXPECT_LT(max_relative(gpu[i].to(Device::cpu()), cpu[i]), tol) << what << " tensor " << i;
    }
  };
  {  // matmul with the batched-times-2-D form of a Linear layer; fp32 accumulation on both sides
    Tensor a = randn({4, 33, 256}, gen, kF16), b = randn({96, 256}, gen, kF16), g = randn({4, 33, 96}, gen, kF16);
    auto run = [&](Device d) {
      Tensor ad = leaf(a, d), bd = leaf(b, d);
      Tensor y = matmul(ad, bd, false, true);
      y.backward(g.to(d));
      return std::vector<Tensor>{y.to(Device::cpu()), ad.grad().to(Device::cpu()), bd.grad().to(Device::cpu())};
    };
    grads_match(run(Device::cuda(0)), run(Device::cpu()), 4e-3, "matmul");
  }
  {  // layer norm: float32 statistics
    Tensor x = randn({70, 768}, gen, kF16), w = randn({768}, gen, kF16), b = randn({768}, gen, kF16);
    Tensor g = randn({70, 768}, gen, kF16);
    auto run = [&](Device d) {
      Tensor xd = leaf(x, d), wd = leaf(w, d), bd = leaf(b, d);
      Tensor y = layer_norm(xd, wd, bd, 1e-5);
      y.backward(g.to(d));
      return std::vector<Tensor>{y.to(Device::cpu()), xd.grad().to(Device::cpu()), wd.grad().to(Device::cpu()),
                                 bd.grad().to(Device::cpu())};
    };
    grads_match(run(Device::cuda(0)), run(Device::cpu()), 1e-2, "layer_norm");
  }
  {  // cross-entropy over a wide vocabulary: float32 loss from float16 logits
    Tensor logits = randn({16, 3001}, gen, kF16);
    Tensor targets = randint({16}, 0, 3001, gen, TensorOptions{}.with_dtype(DType::Int64));
    auto run = [&](Device d) {
      Tensor ld = leaf(logits, d);
      Tensor loss = cross_entropy(ld, targets.to(d));
      EXPECT_EQ(loss.dtype(), DType::Float32);
      (loss * 1024.0).backward();  // a loss scale, as float16 training uses
      return std::vector<Tensor>{loss.to(Device::cpu()), ld.grad().to(Device::cpu())};
    };
    grads_match(run(Device::cuda(0)), run(Device::cpu()), 4e-3, "cross_entropy");
  }
  {  // causal attention: float16 on CUDA takes the composed path (the fused kernels are bfloat16 only)
    Tensor q = randn({2, 2, 100, 64}, gen, kF16), k = randn({2, 2, 100, 64}, gen, kF16);
    Tensor v = randn({2, 2, 100, 64}, gen, kF16), g = randn({2, 2, 100, 64}, gen, kF16);
    EXPECT_FALSE(fused_causal_attention_supported(DType::Float16, 64));
    auto run = [&](Device d) {
      Tensor qd = leaf(q, d), kd = leaf(k, d), vd = leaf(v, d);
      Tensor y = causal_attention(qd, kd, vd, 0.125);
      y.backward(g.to(d));
      return std::vector<Tensor>{y.to(Device::cpu()), qd.grad().to(Device::cpu()), kd.grad().to(Device::cpu()),
                                 vd.grad().to(Device::cpu())};
    };
    grads_match(run(Device::cuda(0)), run(Device::cpu()), 1e-2, "causal_attention");
  }
}

}  // namespace
}  // namespace dpt
