// Every op of core/ops.h, forward and backward, gives the same numbers on CUDA as on the CPU: float32
// within 1e-5 relative (scaled by the tensor's magnitude for elements near zero), bfloat16 within
// 1e-2, float16 within 4e-3. Inputs are fresh random draws; shapes are odd on purpose (tails after
// 16-byte vectors, unaligned rows, warp-per-row and block-per-row softmax, chunked reductions).
// Skipped without a GPU.
//
// float32 matmul: cuBLAS runs in IEEE float32 here because dptrain never enables TF32 unless asked
// (cuda::set_allow_tf32, off by default; see core/cuda/handles.h). With TF32 the products would be
// ~1e-3 relative and this 1e-5 parity could not hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace dpt {
namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Tensor(const Inputs&)>;

#define SKIP_WITHOUT_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct Result {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
};

// Runs f on `inputs` (CPU tensors) moved to `device`, floating ones converted to `dtype` and made
// leaves; returns the output and the gradients of sum(out * w) for weights w drawn on that device
// (the same numbers on both devices: Philox draws do not depend on the device).
Result run_on(Device device, DType dtype, const Fn& f, const Inputs& inputs) {
  Inputs leaves;
  for (const Tensor& x : inputs) {
    if (!is_floating(x.dtype())) {
      leaves.push_back(x.to(device));
      continue;
    }
    Tensor l = x.to(dtype).to(device).detach().clone();
    l.requires_grad_(true);
    leaves.push_back(l);
  }
  Tensor out = f(leaves);
  EXPECT_EQ(out.device(), device);
  Result r{out.to_vector<double>(), {}};
  if (!is_floating(out.dtype())) return r;
  Generator gen(77);
  Tensor w = rand(out.shape(), gen, out.options(), 0.5, 1.5);
  sum(mul(out, w)).backward();
  for (const Tensor& l : leaves) {
    if (is_floating(l.dtype())) {
      Tensor g = l.grad();
      r.grads.push_back(g.defined() ? g.to_vector<double>() : std::vector<double>());
    }
  }
  return r;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rtol * (std::abs(want[i]) + 0.1 * scale) + 1e-30;
    if (!(std::abs(got[i] - want[i]) <= tol) && reported++ < 5) {
      ADD_FAILURE() << what << " element " << i << ": cuda " << got[i] << " vs cpu " << want[i] << " (tol " << tol
                    << ")";
    }
  }
}

// CPU vs CUDA in float32, bfloat16 and float64. `f32_rtol` is 1e-5 except where an op's float32
// result is a difference of long sums (see SoftmaxFamily).
void expect_parity(const std::string& name, const Fn& f, const Inputs& inputs, double f32_rtol = 1e-5) {
  struct Case {
    DType dtype;
    double rtol;
  };
  for (Case c : {Case{DType::Float32, f32_rtol}, Case{DType::BFloat16, 1e-2}, Case{DType::Float16, 4e-3},
                 Case{DType::Float64, 1e-10}}) {
    SCOPED_TRACE(name + " in " + dtype_name(c.dtype));
    Result cpu = run_on(Device::cpu(), c.dtype, f, inputs);
    Result gpu = run_on(Device::cuda(0), c.dtype, f, inputs);
    const std::string what = name + " (" + dtype_name(c.dtype) + ")";
    expect_close(gpu.out, cpu.out, c.rtol, what + " output");
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    for (size_t i = 0; i < gpu.grads.size(); ++i) {
      expect_close(gpu.grads[i], cpu.grads[i], c.rtol, what + " gradient " + std::to_string(i));
    }
  }
}

class CudaParity : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  Tensor normal(const Shape& shape) { return randn(shape, gen_); }
  Tensor positive(const Shape& shape) { return rand(shape, gen_, {}, 0.5, 2.0); }
  Tensor indices(const Shape& shape, int64_t high, DType dtype) {
    return randint(shape, 0, high, gen_, TensorOptions{}.with_dtype(dtype));
  }
  Generator gen_{2024};
};

TEST_F(CudaParity, BinaryOpsWithBroadcasting) {
  for (auto [name, op] : std::vector<std::pair<std::string, Tensor (*)(const Tensor&, const Tensor&)>>{
           {"add", add}, {"sub", sub}, {"mul", mul}}) {
    expect_parity(name + " same shape", [op = op](const Inputs& x) { return op(x[0], x[1]); },
                  {normal({33, 65}), normal({33, 65})});
    expect_parity(name + " broadcast", [op = op](const Inputs& x) { return op(x[0], x[1]); },
                  {normal({4, 1, 5}), normal({3, 1})});
    expect_parity(name + " row bias", [op = op](const Inputs& x) { return op(x[0], x[1]); },
                  {normal({64, 48}), normal({48})});
  }
  expect_parity("div", [](const Inputs& x) { return div(x[0], x[1]); }, {normal({17, 9}), positive({9})});
  expect_parity("div same shape", [](const Inputs& x) { return div(x[0], x[1]); }, {normal({1003}), positive({1003})});
  expect_parity("strided operand", [](const Inputs& x) { return add(x[0].transpose(0, 1), x[1]); },
                {normal({7, 5}), normal({5, 7})});
}

TEST_F(CudaParity, UnaryOpsAndScalars) {
  const Shape odd{1003};  // 16-byte vectors plus a tail
  expect_parity("add scalar", [](const Inputs& x) { return add(x[0], 0.75); }, {normal(odd)});
  expect_parity("mul scalar", [](const Inputs& x) { return mul(x[0], -1.5); }, {normal(odd)});
  expect_parity("neg", [](const Inputs& x) { return neg(x[0]); }, {normal(odd)});
  expect_parity("exp", [](const Inputs& x) { return exp(x[0]); }, {normal(odd)});
  expect_parity("log", [](const Inputs& x) { return log(x[0]); }, {positive(odd)});
  expect_parity("sqrt", [](const Inputs& x) { return sqrt(x[0]); }, {positive(odd)});
  expect_parity("pow 3", [](const Inputs& x) { return pow(x[0], 3.0); }, {normal(odd)});
  expect_parity("pow 0.5", [](const Inputs& x) { return pow(x[0], 0.5); }, {positive(odd)});
  expect_parity("relu", [](const Inputs& x) { return relu(x[0]); }, {normal(odd)});
  expect_parity("gelu", [](const Inputs& x) { return gelu(x[0]); }, {normal(odd)});
  expect_parity("tanh", [](const Inputs& x) { return tanh(x[0]); }, {normal(odd)});
  expect_parity("sigmoid", [](const Inputs& x) { return sigmoid(x[0]); }, {normal(odd)});
  // A view that starts one element in: not 16-byte aligned, so the scalar path runs.
  expect_parity("unaligned view", [](const Inputs& x) { return exp(slice(x[0], 0, 1, 1003)); }, {normal(odd)});
}

TEST_F(CudaParity, Reductions) {
  expect_parity("sum all", [](const Inputs& x) { return sum(x[0]); }, {normal({37, 129})});
  expect_parity("sum all, long", [](const Inputs& x) { return sum(x[0]); }, {normal({300001})});
  for (int64_t d : {0, 1, 2}) {
    const std::string tag = " dim " + std::to_string(d);
    expect_parity("sum" + tag, [d](const Inputs& x) { return sum(x[0], d); }, {normal({6, 7, 8})});
    expect_parity("sum keepdim" + tag, [d](const Inputs& x) { return sum(x[0], d, true); }, {normal({6, 7, 8})});
    expect_parity("mean" + tag, [d](const Inputs& x) { return mean(x[0], d); }, {normal({6, 7, 8})});
    expect_parity("max" + tag, [d](const Inputs& x) { return max(x[0], d); }, {normal({6, 7, 8})});
    expect_parity("argmax" + tag, [d](const Inputs& x) { return argmax(x[0], d); }, {normal({6, 7, 8})});
  }
  expect_parity("mean all", [](const Inputs& x) { return mean(x[0]); }, {normal({50, 3})});
  // Few long columns / few long rows: the chunked two-pass paths.
  expect_parity("sum tall columns", [](const Inputs& x) { return sum(x[0], 0); }, {normal({20000, 3})});
  expect_parity("max long rows", [](const Inputs& x) { return max(x[0], 1); }, {normal({2, 100000})});
  expect_parity("argmax long rows", [](const Inputs& x) { return argmax(x[0], 1); }, {normal({3, 70000})});
  expect_parity("max tall columns", [](const Inputs& x) { return max(x[0], 0, true); }, {normal({30000, 2})});
}

TEST_F(CudaParity, Matmul) {
  expect_parity("matmul", [](const Inputs& x) { return matmul(x[0], x[1]); }, {normal({17, 33}), normal({33, 9})});
  expect_parity("matmul A^T", [](const Inputs& x) { return matmul(x[0], x[1], true, false); },
                {normal({33, 17}), normal({33, 9})});
  expect_parity("matmul B^T", [](const Inputs& x) { return matmul(x[0], x[1], false, true); },
                {normal({17, 33}), normal({9, 33})});
  expect_parity("matmul A^T B^T", [](const Inputs& x) { return matmul(x[0], x[1], true, true); },
                {normal({33, 17}), normal({9, 33})});
  expect_parity("batched matmul", [](const Inputs& x) { return matmul(x[0], x[1]); },
                {normal({3, 17, 33}), normal({3, 33, 9})});
  expect_parity("batched with shared 2-d", [](const Inputs& x) { return matmul(x[0], x[1], false, true); },
                {normal({2, 3, 16, 64}), normal({40, 64})});
  expect_parity("larger", [](const Inputs& x) { return matmul(x[0], x[1]); }, {normal({128, 256}), normal({256, 96})});
}

TEST_F(CudaParity, SoftmaxFamily) {
  // softmax backward is gx = p * (gy - sum(gy * p)): with rows of thousands, the float32 dot product
  // summed in a different order (CPU: sequential, GPU: a tree) differs by ~sqrt(n) ulp, and the
  // subtraction magnifies that relative to gx. Long rows therefore compare at 1e-4 in float32.
  for (Shape shape : {Shape{8, 37}, Shape{4, 2048}, Shape{3, 3001}, Shape{2, 3, 64}}) {
    const double f32_rtol = shape.back() > 1024 ? 1e-4 : 1e-5;
    expect_parity(
        "softmax " + shape_str(shape), [](const Inputs& x) { return softmax(x[0]); }, {normal(shape)}, f32_rtol);
    expect_parity(
        "log_softmax " + shape_str(shape), [](const Inputs& x) { return log_softmax(x[0]); }, {normal(shape)},
        f32_rtol);
  }
}

TEST_F(CudaParity, ShapeOps) {
  expect_parity("reshape", [](const Inputs& x) { return reshape(x[0], {5, -1}); }, {normal({2, 5, 3})});
  expect_parity("transpose", [](const Inputs& x) { return transpose(x[0], 0, 2); }, {normal({2, 5, 3})});
  expect_parity("permute", [](const Inputs& x) { return exp(permute(x[0], {2, 0, 1})); }, {normal({2, 5, 3})});
  expect_parity("concat",
                [](const Inputs& x) {
                  return concat({x[0], x[1], x[0]}, 1);
                },
                {normal({3, 4}), normal({3, 2})});
  expect_parity("split",
                [](const Inputs& x) {
                  auto parts = split(x[0], {2, 3, 1}, 1);
                  return concat({mul(parts[2], 2.0), parts[0], exp(parts[1])}, 1);
                },
                {normal({4, 6})});
  expect_parity("slice", [](const Inputs& x) { return slice(x[0], 1, 2, 5); }, {normal({4, 6})});
  // Head split/merge as in attention: a permute that keeps the last dim, then a contiguous copy.
  expect_parity("permute keeping the last dim",
                [](const Inputs& x) {
                  return exp(permute(x[0], {0, 2, 1, 3}));
                },
                {normal({2, 5, 3, 16})});
}

TEST_F(CudaParity, EmbeddingAndLosses) {
  for (DType index_dtype : {DType::Int32, DType::Int64}) {
    expect_parity(std::string("embedding ") + dtype_name(index_dtype),
                  [](const Inputs& x) { return embedding(x[0], x[1]); },
                  {normal({50, 16}), indices({4, 9}, 50, index_dtype)});
    expect_parity(std::string("embedding odd dim ") + dtype_name(index_dtype),
                  [](const Inputs& x) { return embedding(x[0], x[1]); },
                  {normal({7, 5}), indices({40}, 7, index_dtype)});
  }
  std::vector<int64_t> t(16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = i % 5 == 3 ? -100 : static_cast<int64_t>((i * 7) % 10);
  Tensor targets = from_vector(t, {16}, TensorOptions{}.with_dtype(DType::Int64));
  expect_parity("cross_entropy", [](const Inputs& x) { return cross_entropy(x[0], x[1]); },
                {normal({16, 10}), targets});
  expect_parity("cross_entropy int32, wide", [](const Inputs& x) { return cross_entropy(x[0], x[1]); },
                {normal({8, 3001}), indices({8}, 3001, DType::Int32)});
  expect_parity("cross_entropy ignore 7", [](const Inputs& x) { return cross_entropy(x[0], x[1], 7); },
                {normal({12, 9}), indices({12}, 9, DType::Int64)});
  expect_parity("mse_loss", [](const Inputs& x) { return mse_loss(x[0], x[1]); }, {normal({33, 7}), normal({33, 7})});
}

// The embedding backward adds repeated rows in index order without atomics: bit-identical to the CPU
// in float32 and across runs.
TEST(CudaEmbedding, BackwardIsDeterministicAndMatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  Generator gen(5);
  Tensor weight = randn({64, 96}, gen);
  Tensor idx = randint({4096}, 0, 64, gen, TensorOptions{}.with_dtype(DType::Int64));  // ~64 repeats per row
  Tensor grad = randn({4096, 96}, gen);
  auto weight_grad = [&](Device device) {
    Tensor w = weight.to(device).detach().clone();
    w.requires_grad_(true);
    Tensor out = embedding(w, idx.to(device));
    out.backward(grad.to(device));
    return w.grad().to_vector<float>();
  };
  std::vector<float> cpu = weight_grad(Device::cpu());
  std::vector<float> first = weight_grad(Device::cuda(0));
  std::vector<float> second = weight_grad(Device::cuda(0));
  EXPECT_EQ(first, second);
  EXPECT_EQ(first, cpu);
}

// Rows gathered on the device are the CPU's bytes, whatever the row width: 16-byte words (float32 x 8),
// 4-byte words (float32 x 3, int64 labels), single bytes (bf16 x 3); an index out of range gives zeros.
TEST(CudaGatherRows, EqualsTheCpuBitForBitForEveryRowWidth) {
  SKIP_WITHOUT_GPU();
  Generator gen(8);
  const Tensor idx = randint({777}, 0, 300, gen, TensorOptions{}.with_dtype(DType::Int64));
  const auto gathered = [&](const Tensor& src, Device device) {
    Shape shape = src.shape();
    shape[0] = idx.numel();
    Tensor out = Tensor::empty(shape, TensorOptions{}.with_dtype(src.dtype()).with_device(device));
    kernels::gather_rows(src.to(device), idx.to(device), out);
    return out.to(Device::cpu());
  };
  for (const Shape& shape : {Shape{300, 8}, Shape{300, 3}, Shape{300, 2, 5}}) {
    const Tensor src = randn(shape, gen);
    EXPECT_EQ(gathered(src, Device::cuda(0)).to_vector<float>(), gathered(src, Device::cpu()).to_vector<float>())
        << shape_str(shape);
  }
  const Tensor halves = randn({300, 3}, gen, TensorOptions{}.with_dtype(DType::BFloat16));
  EXPECT_EQ(gathered(halves, Device::cuda(0)).to_vector<float>(), gathered(halves, Device::cpu()).to_vector<float>());
  const Tensor labels = randint({300}, -1000, 1000, gen, TensorOptions{}.with_dtype(DType::Int64));
  EXPECT_EQ(gathered(labels, Device::cuda(0)).to_vector<int64_t>(),
            gathered(labels, Device::cpu()).to_vector<int64_t>());

  const Device gpu = Device::cuda(0);
  Tensor out = Tensor::empty({2, 3}, TensorOptions{}.with_device(gpu));
  kernels::gather_rows(
      randn({4, 3}, gen).to(gpu),
      from_vector(std::vector<int64_t>{4, -1}, {2}, TensorOptions{}.with_dtype(DType::Int64).with_device(gpu)), out);
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(6, 0.0f));
}

TEST(CudaRandom, DrawsAreIdenticalOnBothDevices) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator a(123), b(123);
    const TensorOptions cpu = TensorOptions{}.with_dtype(dtype);
    const TensorOptions gpu = cpu.with_device(Device::cuda(0));
    std::vector<double> n_cpu = randn({1 << 18}, a, cpu, 0.5, 2.0).to_vector<double>();
    std::vector<double> n_gpu = randn({1 << 18}, b, gpu, 0.5, 2.0).to_vector<double>();
    size_t mismatches = 0;
    for (size_t i = 0; i < n_cpu.size(); ++i) mismatches += n_cpu[i] != n_gpu[i];
    EXPECT_EQ(mismatches, 0u) << "normal draws differ between CPU and GPU";
    EXPECT_EQ(rand({1 << 18}, a, cpu, -1.0, 3.0).to_vector<double>(),
              rand({1 << 18}, b, gpu, -1.0, 3.0).to_vector<double>());
    EXPECT_EQ(a.offset(), b.offset());
  }
  Generator a(9), b(9);
  EXPECT_EQ(randint({1000}, -5, 17, a).to_vector<int64_t>(),
            randint({1000}, -5, 17, b, TensorOptions{}.with_device(Device::cuda(0))).to_vector<int64_t>());
}

TEST(CudaCopies, ConversionsFillsAndRangesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  Generator gen(11);
  const Device gpu = Device::cuda(0);
  Tensor base = mul(randn({5, 7, 3}, gen, TensorOptions{}.with_dtype(DType::Float64)), 40.0);
  Tensor rows = mul(randn({4, 6, 16}, gen, TensorOptions{}.with_dtype(DType::Float64)), 40.0);
  const std::vector<DType> all{DType::Float32, DType::BFloat16, DType::Float64, DType::Int32, DType::Int64};
  for (DType from : all) {
    Tensor src_cpu = base.to(from);
    Tensor src_gpu = src_cpu.to(gpu);
    EXPECT_EQ(src_gpu.to_vector<double>(), src_cpu.to_vector<double>()) << "round trip " << dtype_name(from);
    for (DType to : all) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      EXPECT_EQ(src_gpu.to(to).to_vector<double>(), src_cpu.to(to).to_vector<double>());
      // Strided source: the copy kernel walks a permuted view.
      EXPECT_EQ(src_gpu.permute({2, 0, 1}).to(to).to_vector<double>(),
                src_cpu.permute({2, 0, 1}).to(to).to_vector<double>());
      // A permute that keeps the last dim: the vectorised strided copy.
      Tensor rows_cpu = rows.to(from);
      EXPECT_EQ(rows_cpu.to(gpu).permute({1, 0, 2}).to(to).to_vector<double>(),
                rows_cpu.permute({1, 0, 2}).to(to).to_vector<double>());
    }
    TensorOptions o = TensorOptions{}.with_dtype(from);
    EXPECT_EQ(full({1001}, -2.5, o.with_device(gpu)).to_vector<double>(), full({1001}, -2.5, o).to_vector<double>());
    EXPECT_EQ(arange(1001, o.with_device(gpu)).to_vector<double>(), arange(1001, o).to_vector<double>());
    EXPECT_EQ(zeros({3, 3}, o.with_device(gpu)).to_vector<double>(), std::vector<double>(9, 0.0));
  }
}

}  // namespace
}  // namespace dpt
