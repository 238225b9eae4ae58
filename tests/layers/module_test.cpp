// Module: names, order, counting, modes, placement and state dicts.
#include "layers/module.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
#include "layers/gpt.h"
#include "layers/linear.h"
#include "layers/mlp.h"

namespace dpt::nn {
namespace {

std::vector<std::string> names_of(const NamedTensors& ts) {
  std::vector<std::string> out;
  for (const auto& [n, t] : ts) out.push_back(n);
  return out;
}

GPTConfig tiny_gpt() {
  GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

TEST(Module, ParametersAreNamedHierarchicallyInRegistrationOrder) {
  Generator gen(0);
  MLP mlp({2, 5, 3}, "relu", gen);
  EXPECT_EQ(names_of(mlp.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(mlp.num_parameters(), 2 * 5 + 5 + 5 * 3 + 3);

  GPT gpt(tiny_gpt(), gen);
  auto names = names_of(gpt.named_parameters());
  ASSERT_EQ(names.size(), 2u + 2u * 12u + 2u);
  EXPECT_EQ(names[0], "wte.weight");
  EXPECT_EQ(names[1], "wpe.weight");
  EXPECT_EQ(names[2], "blocks.0.ln1.weight");
  EXPECT_EQ(names[4], "blocks.0.attn.qkv.weight");
  EXPECT_EQ(names[7], "blocks.0.attn.proj.bias");
  EXPECT_EQ(names[13], "blocks.0.mlp.proj.bias");
  EXPECT_EQ(names[14], "blocks.1.ln1.weight");
  EXPECT_EQ(names.back(), "ln_f.bias");
  // Tied head: the vocabulary matrix is counted once.
  int64_t c = 8, v = 11;
  int64_t per_block = 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c + (c * 4 * c + 4 * c) + (4 * c * c + c);
  EXPECT_EQ(gpt.num_parameters(), v * c + 8 * c + 2 * per_block + 2 * c);
  for (const auto& [n, p] : gpt.named_parameters()) {
    EXPECT_TRUE(p.is_leaf() && p.requires_grad()) << n;
  }
}

TEST(Module, SameSeedSameWeightsDifferentSeedDifferentWeights) {
  Generator a(7), b(7), c(8);
  GPT ga(tiny_gpt(), a), gb(tiny_gpt(), b), gc(tiny_gpt(), c);
  auto pa = ga.named_parameters(), pb = gb.named_parameters(), pc = gc.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>());
  EXPECT_NE(pa[0].second.to_vector<float>(), pc[0].second.to_vector<float>());
}

// Layers built without a generator draw from the default one, which manual_seed resets (torch.manual_seed).
TEST(Module, ManualSeedRepeatsTheDefaultGeneratorsDraws) {
  manual_seed(3);
  Linear a(4, 2);
  manual_seed(3);
  Linear b(4, 2);
  Linear c(4, 2);  // the draws after b's
  EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>());
  EXPECT_EQ(a.bias.to_vector<float>(), b.bias.to_vector<float>());
  EXPECT_NE(a.weight.to_vector<float>(), c.weight.to_vector<float>());
}

TEST(Module, Gpt2InitializationHasTheRightScales) {
  GPTConfig cfg = tiny_gpt();
  cfg.n_embd = 64;
  cfg.vocab_size = 256;
  cfg.n_layer = 8;
  Generator gen(1);
  GPT gpt(cfg, gen);
  auto stddev = [](const Tensor& t) {
    auto v = t.to_vector<double>();
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= static_cast<double>(v.size());
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  auto params = gpt.named_parameters();
  auto get = [&](const std::string& n) {
    for (auto& [k, t] : params)
      if (k == n) return t;
    return Tensor();
  };
  EXPECT_NEAR(stddev(get("wte.weight")), 0.02, 0.002);
  EXPECT_NEAR(stddev(get("blocks.0.attn.qkv.weight")), 0.02, 0.002);
  EXPECT_NEAR(stddev(get("blocks.3.mlp.proj.weight")), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_EQ(get("blocks.0.attn.qkv.bias").to_vector<float>(), std::vector<float>(192, 0.0f));
  EXPECT_EQ(get("ln_f.weight").to_vector<float>(), std::vector<float>(64, 1.0f));
}

TEST(Module, TrainEvalIsRecursive) {
  GPT gpt(tiny_gpt());
  EXPECT_TRUE(gpt.blocks->is_training());
  gpt.eval();
  EXPECT_FALSE(gpt.is_training());
  EXPECT_FALSE((*gpt.blocks)[1].is_training());
  gpt.train();
  EXPECT_TRUE((*gpt.blocks)[1].is_training());
}

TEST(Module, ToDtypeKeepsTheSameParameterHandles) {
  Generator gen(0);
  Linear lin(3, 2, true, gen);
  Tensor handle = lin.weight;
  auto before = handle.to_vector<double>();
  lin.to(DType::Float64);
  EXPECT_EQ(handle.dtype(), DType::Float64);
  EXPECT_TRUE(lin.named_parameters()[0].second.same(handle));
  EXPECT_EQ(handle.to_vector<double>(), before);  // float32 -> float64 is exact
  EXPECT_TRUE(handle.requires_grad());
  Tensor y = lin.forward(ones({4, 3}, TensorOptions{}.with_dtype(DType::Float64)));
  EXPECT_EQ(y.dtype(), DType::Float64);
  EXPECT_THROW(lin.to(DType::Int32), Error);
}

// A module with buffers: a float running statistic saved with the state, an int64 counter that is not.
class WithBuffers : public Module {
 public:
  explicit WithBuffers(Generator& gen) {
    weight = register_parameter("weight", randn({2, 3}, gen));
    running = register_buffer("running", full({3}, 0.5));
    seen = register_buffer("seen", zeros({1}, TensorOptions{}.with_dtype(DType::Int64)), /*persistent=*/false);
  }
  Tensor weight, running, seen;
};

TEST(Module, BuffersMoveWithTheModuleAndOnlyPersistentOnesAreSaved) {
  Generator g1(1), g2(2);
  WithBuffers a(g1), b(g2);
  EXPECT_EQ(names_of(a.named_buffers()), (std::vector<std::string>{"running", "seen"}));
  EXPECT_EQ(names_of(a.state_dict()), (std::vector<std::string>{"weight", "running"}));
  EXPECT_EQ(names_of(a.named_parameters()), (std::vector<std::string>{"weight"}));
  EXPECT_FALSE(a.running.requires_grad());

  a.running.fill_(2.0);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.running.to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_EQ(b.weight.to_vector<float>(), a.weight.to_vector<float>());

  // to(dtype) converts floating buffers in place of the same handle and leaves integer ones alone.
  a.to(DType::Float64);
  EXPECT_EQ(a.running.dtype(), DType::Float64);
  EXPECT_EQ(a.running.to_vector<double>(), (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(a.seen.dtype(), DType::Int64);
  EXPECT_TRUE(a.named_buffers()[0].second.same(a.running));
}

TEST(Module, ABufferNameTakenByAParameterIsRefused) {
  class Clash : public Module {
   public:
    Clash() {
      register_parameter("w", zeros({2}));
      register_buffer("w", zeros({2}));
    }
  };
  try {
    Clash clash;
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w' is already registered as a parameter"), std::string::npos) << e.what();
  }
}

TEST(Module, StateDictRoundTripsBetweenModels) {
  Generator a(1), b(2);
  MLP m1({3, 4, 2}, "tanh", a), m2({3, 4, 2}, "tanh", b);
  m2.load_state_dict(m1.state_dict());
  auto s1 = m1.state_dict(), s2 = m2.state_dict();
  for (size_t i = 0; i < s1.size(); ++i) EXPECT_EQ(s1[i].second.to_vector<float>(), s2[i].second.to_vector<float>());
  // Loading copies: the models stay independent.
  Tensor w = m1.named_parameters()[0].second;
  w.fill_(5.0);
  EXPECT_NE(m2.named_parameters()[0].second.to_vector<float>()[0], 5.0f);
}

void expect_load_error(Module& m, const NamedTensors& state, const std::string& needle) {
  try {
    m.load_state_dict(state);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Module, LoadStateDictNamesTheFirstMismatch) {
  MLP m({3, 4, 2});
  NamedTensors good = m.state_dict();
  auto before = good[0].second.to_vector<float>();

  NamedTensors missing(good.begin() + 1, good.end());
  expect_load_error(m, missing, "missing '0.weight'");

  NamedTensors shape = good;
  shape[2].second = zeros({4, 3});
  expect_load_error(m, shape, "'2.weight' has shape [4, 3] in the given state, expected [2, 4]");

  NamedTensors dtype = good;
  dtype[1].second = zeros({4}, TensorOptions{}.with_dtype(DType::Float64));
  expect_load_error(m, dtype, "'0.bias' has dtype float64");

  NamedTensors extra = good;
  extra.emplace_back("3.weight", zeros({1}));
  expect_load_error(m, extra, "unexpected '3.weight'");
  EXPECT_NO_THROW(m.load_state_dict(extra, /*strict=*/false));

  // Nothing was copied by the failed loads.
  EXPECT_EQ(m.state_dict()[0].second.to_vector<float>(), before);
}

// A child that logs when it runs and adds its index, so the order and the result are both seen.
struct Logging : Module {
  Logging(std::vector<std::string>* log, int index) : log(log), index(index) {}
  Tensor forward(const Tensor& x) override {
    log->push_back("run " + std::to_string(index));
    return x + static_cast<double>(index);
  }
  std::vector<std::string>* log;
  int index;
};

TEST(Module, SequentialCallsItsBeforeChildHookJustBeforeEachChild) {
  std::vector<std::string> log;
  Sequential seq;
  for (int i = 0; i < 3; ++i) seq.push_back(std::make_shared<Logging>(&log, i + 1));
  seq.set_before_child([&log](size_t i) { log.push_back("before " + std::to_string(i)); });
  const Tensor y = seq.forward(from_vector<float>({1.0f, 2.0f}, {2}));
  EXPECT_EQ(log, (std::vector<std::string>{"before 0", "run 1", "before 1", "run 2", "before 2", "run 3"}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{7.0f, 8.0f}));
  log.clear();
  seq.set_before_child(nullptr);
  seq.forward(from_vector<float>({0.0f}, {1}));
  EXPECT_EQ(log, (std::vector<std::string>{"run 1", "run 2", "run 3"}));
}

}  // namespace
}  // namespace dpt::nn
