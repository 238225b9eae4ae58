#pragma once
// Text sampled from a trained GPT, autoregressively, one token at a time: dpt-train's sample at the
// end of a run and dpt-generate both go through generate().
//
// Each step asks a NextTokenLogits for the logits of the token after the sequence so far and draws
// from softmax(logits / temperature), restricted to the top_k largest when top_k > 0. A seeded
// std::mt19937_64 makes the text a pure function of (model, prompt, options, seed). The model side is
// an interface: CachedGpt feeds only the newest token (a KV cache), WindowedGpt the whole window (the
// reference the cached one is tested against).
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "data/char_text.h"
#include "layers/gpt.h"

namespace dpt::train {

struct SamplingOptions {
  double temperature = 0.8;  // > 0; 0 picks the most likely token (greedy)
  int64_t top_k = 0;         // > 0: draw among the k most likely tokens only; 1 is greedy
  // > 0: draw only ids below it (a tokenizer's vocabulary when the model's is padded beyond it).
  int64_t vocab_limit = 0;
};

// The logits of the token that follows `ids` (every token so far; between calls `ids` only grows by the
// tokens picked).
class NextTokenLogits {
 public:
  virtual ~NextTokenLogits() = default;
  virtual std::vector<float> next(const std::vector<int32_t>& ids) = 0;
};

// Runs the GPT, without autograd, on the last block_size tokens at every step and returns the last
// position's logits. Keeps the model in eval mode while it exists (the mode is restored).
class WindowedGpt : public NextTokenLogits {
 public:
  explicit WindowedGpt(nn::GPT& model);
  ~WindowedGpt() override;
  WindowedGpt(const WindowedGpt&) = delete;
  WindowedGpt& operator=(const WindowedGpt&) = delete;
  std::vector<float> next(const std::vector<int32_t>& ids) override;
  const Device& device() const { return device_; }

 private:
  nn::GPT& model_;
  bool was_training_;
  Device device_;
};

// The same logits through a KV cache (layers/kv_cache.h): the first call runs the prompt, each later
// call only the token picked since, so a token costs one position, not the whole prefix. Past
// block_size tokens every position of the window shifts, so each call then runs the window like
// WindowedGpt, which also keeps the model in eval mode while this exists.
class CachedGpt : public NextTokenLogits {
 public:
  explicit CachedGpt(nn::GPT& model) : model_(model), window_(model) {}
  std::vector<float> next(const std::vector<int32_t>& ids) override;

 private:
  nn::GPT& model_;
  WindowedGpt window_;  // past block_size; holds eval mode and the device
  nn::KvCache cache_;
};

// One draw from `logits` as SamplingOptions describes (no random number is used when greedy). Throws
// when the logits are not finite.
int32_t pick_token(const std::vector<float>& logits, const SamplingOptions& options, std::mt19937_64& rng);

// `count` tokens following `prompt` (at least one token), the random draws seeded by `seed`.
std::vector<int32_t> generate(NextTokenLogits& model, const std::vector<int32_t>& prompt, int64_t count,
                              const SamplingOptions& options, uint64_t seed);

// dpt-train's sample: `count` tokens following `start` at `temperature`, from all tokens.
std::vector<int32_t> sample_tokens(nn::GPT& model, int32_t start, int64_t count, uint64_t seed,
                                   double temperature = 0.8);

// Decoded text when there is a character vocabulary, else the ids separated by spaces.
std::string render_tokens(const std::vector<int32_t>& ids, const std::optional<data::CharVocab>& vocab);

}  // namespace dpt::train
