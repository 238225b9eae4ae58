// The sampling rule of generation: temperature, top-k, the vocabulary limit, greedy picks, and a loop
// that feeds each pick back (checked with a scripted model, no GPT needed).
#include "text_sample.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

namespace dpt::train {
namespace {

std::map<int32_t, int> draws(const std::vector<float>& logits, const SamplingOptions& o, int n) {
  std::mt19937_64 rng(11);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[pick_token(logits, o, rng)];
  return counts;
}

TEST(PickToken, TopKDrawsOnlyAmongTheKMostLikelyInProportionToTheirSoftmax) {
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  const auto counts = draws({0.0f, 2.0f, 1.0f, -1.0f, 1.5f}, o, 20000);
  ASSERT_EQ(counts.size(), 2u);  // ids 1 and 4 only
  const double ratio = static_cast<double>(counts.at(1)) / counts.at(4);
  EXPECT_NEAR(ratio, std::exp(0.5), 0.1);  // e^(2 - 1.5); 20,000 draws put it within about 0.04
}

TEST(PickToken, TemperatureSharpensTheDistribution) {
  SamplingOptions o;
  o.temperature = 0.5;
  const auto counts = draws({0.0f, 1.0f}, o, 20000);
  EXPECT_NEAR(static_cast<double>(counts.at(1)) / counts.at(0), std::exp(2.0), 0.4);
}

TEST(PickToken, GreedyTakesTheLargestLogitAndTheLowerIdOnATie) {
  std::mt19937_64 rng(1);
  SamplingOptions top1;
  top1.top_k = 1;
  EXPECT_EQ(pick_token({0.5f, 3.0f, 3.0f, 1.0f}, top1, rng), 1);
  SamplingOptions cold;
  cold.temperature = 0;
  EXPECT_EQ(pick_token({0.5f, 1.0f, 3.0f, 1.0f}, cold, rng), 2);
}

TEST(PickToken, NeverDrawsAtOrAboveTheVocabularyLimit) {
  SamplingOptions o;
  o.temperature = 1.0;
  o.vocab_limit = 2;
  const auto counts = draws({0.0f, 0.0f, 10.0f, 10.0f}, o, 1000);  // the padded ids are the likeliest
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts.count(2) + counts.count(3), 0u);
}

TEST(PickToken, NonFiniteLogitsAreAnError) {
  std::mt19937_64 rng(1);
  EXPECT_THROW(pick_token({0.0f, std::numeric_limits<float>::quiet_NaN()}, SamplingOptions{}, rng), std::exception);
}

// Logits that make token (last + 1) % 5 certain: generation must feed every pick back.
class CountingModel : public NextTokenLogits {
 public:
  std::vector<float> next(const std::vector<int32_t>& ids) override {
    seen.push_back(ids.size());
    std::vector<float> logits(5, -100.0f);
    logits[static_cast<size_t>((ids.back() + 1) % 5)] = 100.0f;
    return logits;
  }
  std::vector<size_t> seen;
};

TEST(Generate, FeedsEachPickBackAndReturnsOnlyTheNewTokens) {
  CountingModel model;
  SamplingOptions o;
  o.temperature = 1.0;
  EXPECT_EQ(generate(model, {3, 3}, 6, o, 0), (std::vector<int32_t>{4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(model.seen, (std::vector<size_t>{2, 3, 4, 5, 6, 7}));
  EXPECT_THROW(generate(model, {}, 1, o, 0), std::exception);
  o.temperature = -1;
  EXPECT_THROW(generate(model, {1}, 1, o, 0), std::exception);
}

// The KV-cached sampler picks what the windowed one picks, token for token, with the same seed: inside
// the block (the cache) and past it (where every position shifts and the window is run again).
TEST(CachedGpt, SamplesTheWindowedModelsTokensInsideAndPastTheBlock) {
  nn::GPTConfig c;
  c.vocab_size = 29;
  c.block_size = 12;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  Generator gen(3);
  nn::GPT model(c, gen);
  SamplingOptions o;
  o.temperature = 1.0;
  std::vector<int32_t> windowed_ids, cached_ids;
  {
    WindowedGpt windowed(model);
    windowed_ids = generate(windowed, {4, 7, 1}, 25, o, 9);
  }
  {
    CachedGpt cached(model);
    cached_ids = generate(cached, {4, 7, 1}, 25, o, 9);
  }
  EXPECT_EQ(cached_ids, windowed_ids);
  EXPECT_TRUE(model.is_training()) << "the sampler restores the model's mode";
}

}  // namespace
}  // namespace dpt::train
