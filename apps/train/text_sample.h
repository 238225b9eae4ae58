#pragma once
// A short text sampled from a trained GPT: autoregressive, one token at a time, from the softmax of
// the last position's logits at temperature 0.8 (seeded, so a run prints the same text every time).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/char_text.h"
#include "layers/gpt.h"

namespace dpt::train {

// Token ids following `start`, generated without autograd in eval mode (the mode is restored).
std::vector<int32_t> sample_tokens(nn::GPT& model, int32_t start, int64_t count, uint64_t seed,
                                   double temperature = 0.8);

// Decoded text when there is a character vocabulary, else the ids separated by spaces.
std::string render_tokens(const std::vector<int32_t>& ids, const std::optional<data::CharVocab>& vocab);

}  // namespace dpt::train
