// GPT::forward_cached (layers/kv_cache.h): the prompt, then one token at a time through the cache, gives
// the logits forward() gives for the whole sequence, at every position; on the CPU in float32 and on a
// GPU in bfloat16 (skipped without one).
#include <gtest/gtest.h>

#include <vector>

#include "core/autograd.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/max_relative.h"
#include "core/ops.h"
#include "layers/gpt.h"

namespace dpt::nn {
namespace {

GPTConfig small(bool bias) {
  GPTConfig c;
  c.vocab_size = 37;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.bias = bias;
  return c;
}

// Logits of positions [0, T) by forward() and by forward_cached (a `prompt`-token prompt, then one token
// at a time), for a batch of two sequences.
std::pair<Tensor, std::vector<Tensor>> both(GPT& model, const Tensor& ids, int64_t prompt) {
  NoGradGuard no_grad;
  model.eval();
  Tensor whole = model.forward(ids);
  KvCache cache;
  std::vector<Tensor> pieces{model.forward_cached(slice(ids, 1, 0, prompt), cache)};
  for (int64_t t = prompt; t < ids.size(1); ++t) pieces.push_back(model.forward_cached(slice(ids, 1, t, t + 1), cache));
  EXPECT_EQ(cache.length, ids.size(1));
  return {whole, pieces};
}

void expect_same_logits(GPT& model, const Tensor& ids, int64_t prompt, double tolerance) {
  auto [whole, pieces] = both(model, ids, prompt);
  int64_t t = 0;
  for (const Tensor& piece : pieces) {
    const int64_t n = piece.size(1);
    EXPECT_LT(max_relative(piece.to(Device::cpu()).to(DType::Float32),
                           slice(whole, 1, t, t + n).to(Device::cpu()).to(DType::Float32)),
              tolerance)
        << "positions " << t << " .. " << t + n - 1;
    t += n;
  }
}

TEST(GptKvCache, CachedLogitsEqualTheWholeSequencesAtEveryPosition) {
  for (bool bias : {true, false}) {
    Generator gen(5);
    GPT model(small(bias), gen);
    Tensor ids = randint({2, 16}, 0, 37, gen, TensorOptions{}.with_dtype(DType::Int64));
    expect_same_logits(model, ids, 5, 1e-5);
    expect_same_logits(model, ids, 1, 1e-5);
  }
}

TEST(GptKvCache, RefusesMorePositionsThanTheBlockAndSeveralNewTokensAfterThePrompt) {
  Generator gen(6);
  GPT model(small(true), gen);
  model.eval();
  NoGradGuard no_grad;
  Tensor ids = randint({1, 16}, 0, 37, gen, TensorOptions{}.with_dtype(DType::Int64));
  KvCache cache;
  model.forward_cached(slice(ids, 1, 0, 4), cache);
  EXPECT_THROW(model.forward_cached(slice(ids, 1, 4, 6), cache), Error);  // two at once after the prompt
  KvCache full;
  model.forward_cached(ids, full);
  EXPECT_THROW(model.forward_cached(slice(ids, 1, 0, 1), full), Error);  // a 17th position
}

TEST(CudaGptKvCache, CachedLogitsEqualTheWholeSequencesInBfloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  GPTConfig c = small(true);
  c.n_embd = 128;  // head size 64: the whole-sequence forward takes the fused attention kernels
  c.block_size = 64;
  Generator gen(7);
  GPT model(c, gen);
  model.to(Device::cuda());
  model.to(DType::BFloat16);
  Tensor ids = randint({2, 64}, 0, 37, gen, TensorOptions{}.with_dtype(DType::Int64)).to(Device::cuda());
  // bf16 logits through two attention implementations: a few units in the last place of bf16.
  expect_same_logits(model, ids, 9, 3e-2);
}

}  // namespace
}  // namespace dpt::nn
