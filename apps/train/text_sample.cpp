#include "text_sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/autograd.h"
#include "core/error.h"
#include "core/factory.h"

namespace dpt::train {

WindowedGpt::WindowedGpt(nn::GPT& model)
    : model_(model),
      was_training_(model.is_training()),
      device_(model.wte->named_parameters().front().second.device()) {
  model_.eval();
}

WindowedGpt::~WindowedGpt() { model_.train(was_training_); }

std::vector<float> WindowedGpt::next(const std::vector<int32_t>& ids) {
  NoGradGuard no_grad;
  // The model sees at most block_size tokens: the most recent ones.
  const auto context = static_cast<size_t>(model_.config().block_size);
  const auto begin = ids.size() > context ? ids.end() - static_cast<std::ptrdiff_t>(context) : ids.begin();
  std::vector<int32_t> window(begin, ids.end());
  const auto t = static_cast<int64_t>(window.size());
  Tensor logits =
      model_.forward(from_vector(window, {1, t}, TensorOptions{}.with_dtype(DType::Int32).with_device(device_)));
  return logits[0][t - 1].to_vector<float>();
}

std::vector<float> CachedGpt::next(const std::vector<int32_t>& ids) {
  const auto n = static_cast<int64_t>(ids.size());
  if (n > model_.config().block_size) return window_.next(ids);
  NoGradGuard no_grad;
  // Feed what the cache has not seen: the whole prompt first, then the one token picked since. A caller
  // that restarts with other ids starts a new cache.
  if (cache_.length >= n) cache_ = nn::KvCache{};
  const int64_t past = cache_.length;
  std::vector<int32_t> fresh(ids.begin() + past, ids.end());
  if (past > 0 && fresh.size() > 1) {  // more than one new token after the prompt: start over
    cache_ = nn::KvCache{};
    return next(ids);
  }
  const auto t = static_cast<int64_t>(fresh.size());
  Tensor logits = model_.forward_cached(
      from_vector(fresh, {1, t}, TensorOptions{}.with_dtype(DType::Int32).with_device(window_.device())), cache_);
  return logits[0][t - 1].to_vector<float>();
}

int32_t pick_token(const std::vector<float>& logits, const SamplingOptions& options, std::mt19937_64& rng) {
  const auto n =
      options.vocab_limit > 0 ? std::min(logits.size(), static_cast<size_t>(options.vocab_limit)) : logits.size();
  DPT_CHECK(n > 0, "no token to sample from (vocabulary limit {})", options.vocab_limit);
  for (size_t i = 0; i < n; ++i)
    DPT_CHECK(std::isfinite(logits[i]), "the model's logit for token {} is {}: the weights are not finite", i,
              logits[i]);
  // Candidates ordered most likely first, the lower id first among equals (so greedy is deterministic).
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const bool greedy = options.temperature == 0 || options.top_k == 1;
  const size_t k = greedy ? 1 : options.top_k > 0 ? std::min(n, static_cast<size_t>(options.top_k)) : n;
  auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (k < n) std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), more_likely);
  if (greedy) return order.front();
  // softmax(logits / temperature) over the candidates, shifted by their maximum for stability.
  float top = logits[order.front()];
  if (k == n) top = *std::max_element(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(n));
  std::vector<double> weights(n, 0.0);
  for (size_t j = 0; j < k; ++j) {
    const int32_t i = order[j];
    weights[i] = std::exp((logits[i] - top) / options.temperature);
  }
  std::discrete_distribution<int32_t> draw(weights.begin(), weights.end());
  return draw(rng);
}

std::vector<int32_t> generate(NextTokenLogits& model, const std::vector<int32_t>& prompt, int64_t count,
                              const SamplingOptions& options, uint64_t seed) {
  DPT_CHECK(!prompt.empty(), "generation needs at least one token to start from");
  DPT_CHECK(options.temperature >= 0 && std::isfinite(options.temperature),
            "the sampling temperature must be finite and >= 0, got {}", options.temperature);
  DPT_CHECK(options.top_k >= 0, "top-k must be >= 0 (0: every token), got {}", options.top_k);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids = prompt;
  for (int64_t n = 0; n < count; ++n) ids.push_back(pick_token(model.next(ids), options, rng));
  return std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(prompt.size()), ids.end());
}

std::vector<int32_t> sample_tokens(nn::GPT& model, int32_t start, int64_t count, uint64_t seed, double temperature) {
  CachedGpt cached(model);
  SamplingOptions options;
  options.temperature = temperature;
  return generate(cached, {start}, count, options, seed);
}

std::string render_tokens(const std::vector<int32_t>& ids, const std::optional<data::CharVocab>& vocab) {
  if (vocab) return vocab->decode(ids);
  std::string out;
  for (int32_t id : ids) {
    if (!out.empty()) out.push_back(' ');
    out.append(std::to_string(id));
  }
  return out;
}

}  // namespace dpt::train
