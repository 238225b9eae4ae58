#pragma once
// Our GPT in Hugging Face's GPT-2 layout and back.
//
// Export writes a folder that transformers.GPT2LMHeadModel.from_pretrained loads: config.json and
// model.safetensors with HF's names, transformer.{wte,wpe}.weight, transformer.h.{i}.{ln_1,ln_2}.*,
// attn.c_attn.*, attn.c_proj.*, mlp.c_fc.*, mlp.c_proj.*, transformer.ln_f.*. HF's Conv1D stores a weight
// as [in, out], the transpose of our Linear's [out, in]; the LM head is tied to wte, so there is no
// lm_head.weight. Our GELU is the tanh approximation, HF's "gelu_new"; LayerNorm eps 1e-5 as GPT-2's.
// A model without biases (model.gpt.bias false) is written with zero biases, which compute the same.
//
// Import (model.init_from) reads either such a folder (or its model.safetensors) or a nanoGPT state dict
// saved as safetensors: the same names, but nn.Linear layouts [out, in], an lm_head.weight equal to wte,
// and "_orig_mod." prefixes after torch.compile. Which layout a file has is read from its c_attn weight,
// [C, 3C] (Conv1D) or [3C, C] (Linear), so the attention and MLP projections are never guessed from a
// square shape. Files without the "transformer." prefix (older HF uploads) load too.
#include <cstdint>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "layers/gpt.h"

namespace dpt::train {

// The GPT's weights under HF GPT-2 names and layouts, wte trimmed to its first `vocab_size` rows (the
// real vocabulary of a padded embedding). CPU float32 tensors.
NamedTensors hf_gpt2_state(nn::GPT& gpt, int64_t vocab_size);

// config.json of the exported model (HF GPT2Config fields), as JSON text.
std::string hf_gpt2_config_json(const nn::GPTConfig& config, int64_t vocab_size);

// Writes <dir>/config.json and <dir>/model.safetensors (each atomically). Existing files there are an
// error unless `overwrite`.
void export_hf_gpt2(nn::GPT& gpt, int64_t vocab_size, const std::string& dir, bool overwrite);

// Loads the weights at `path` (see above) into `gpt`. Every problem is listed in one error naming the
// file: each missing, unexpected or differently shaped tensor by name, a config.json that disagrees on
// heads or activation, non-zero biases for a model without biases. An embedding with fewer rows than the
// model's (GPT-2's 50257 into a padded 50304) fills the first rows; the others keep their initialization.
// Returns a one-line description of what was loaded.
std::string init_gpt_from(nn::GPT& gpt, const std::string& path);

// Mean next-token cross-entropy of `tokens` as one sequence: the first L = min(size, block_size) tokens,
// predictions 1..L-1 from their prefixes, the softmax over the first `vocab_size` logits (what HF
// computes for input_ids = labels = those L tokens on the model exported with that vocabulary).
double gpt_sequence_loss(nn::GPT& gpt, const std::vector<int32_t>& tokens, int64_t vocab_size);

}  // namespace dpt::train
