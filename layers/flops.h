#pragma once
// Model FLOPs per training step, for MFU: the trainer and dpt-bench count with the same function, and
// bench/pytorch_reference.py counts the same way.
//
// Forward + backward of a matmul with P weights costs 6 P FLOPs per token (2 forward, 4 backward).
// GPT adds the attention products that have no weights: QK^T and AV, 2 * 2 * T * d per token per layer
// forward, times 3 with backward = 12 * n_layer * T * d. The position embedding is a lookup (no FLOPs);
// the tied token embedding counts once, as the LM head's matmul.
#include <cstdint>

namespace dpt::nn {

double gpt_flops_per_token(int64_t n_params, int64_t n_layer, int64_t n_embd, int64_t seq_len, int64_t block_size);
double mlp_flops_per_sample(int64_t n_params);

// Dense bf16 matrix-unit peak of the current GPU in TFLOP/s (H100 SXM 989, H200 989, A100 312), or
// `fallback` when the device is unknown; for float32 pass the TF32-free peak yourself.
double peak_bf16_tflops(const char* device_name, double fallback = 989.0);

}  // namespace dpt::nn
