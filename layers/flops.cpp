#include "layers/flops.h"

#include <cstring>

namespace dpt::nn {

double gpt_flops_per_token(int64_t n_params, int64_t n_layer, int64_t n_embd, int64_t seq_len, int64_t block_size) {
  double non_embedding = static_cast<double>(n_params - block_size * n_embd);  // wpe is a lookup
  return 6.0 * non_embedding + 12.0 * static_cast<double>(n_layer * seq_len * n_embd);
}

double mlp_flops_per_sample(int64_t n_params) { return 6.0 * static_cast<double>(n_params); }

double peak_bf16_tflops(const char* device_name, double fallback) {
  if (!device_name) return fallback;
  if (std::strstr(device_name, "H100") || std::strstr(device_name, "H200") || std::strstr(device_name, "H800")) {
    return 989.0;
  }
  if (std::strstr(device_name, "A100") || std::strstr(device_name, "A800")) return 312.0;
  return fallback;
}

}  // namespace dpt::nn
