#include "text_sample.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/autograd.h"
#include "core/factory.h"

namespace dpt::train {

std::vector<int32_t> sample_tokens(nn::GPT& model, int32_t start, int64_t count, uint64_t seed, double temperature) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const Device device = model.wte->named_parameters().front().second.device();
  const int64_t context = model.config().block_size;
  std::vector<int32_t> ids{start};
  std::mt19937_64 rng(seed);
  for (int64_t n = 0; n < count; ++n) {
    // The model sees at most block_size tokens: the most recent ones.
    const auto begin = ids.size() > static_cast<size_t>(context) ? ids.end() - context : ids.begin();
    std::vector<int32_t> window(begin, ids.end());
    const auto t = static_cast<int64_t>(window.size());
    Tensor logits =
        model.forward(from_vector(window, {1, t}, TensorOptions{}.with_dtype(DType::Int32).with_device(device)));
    std::vector<float> last = logits[0][t - 1].to_vector<float>();
    // softmax(logits / temperature), shifted by the maximum for stability.
    const float top = *std::max_element(last.begin(), last.end());
    std::vector<double> weights(last.size());
    for (size_t i = 0; i < last.size(); ++i) weights[i] = std::exp((last[i] - top) / temperature);
    std::discrete_distribution<int32_t> pick(weights.begin(), weights.end());
    ids.push_back(pick(rng));
  }
  model.train(was_training);
  return std::vector<int32_t>(ids.begin() + 1, ids.end());
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
