#pragma once
// A character vocabulary stored in checkpoint metadata (TrainingState::extra, string -> string), so a
// checkpoint of a text run decodes its tokens without the text file it was trained on.
// The value is the vocabulary's bytes, ascending, as lowercase hex pairs ("0a20…": '\n', ' ', …):
// vocabularies are bytes, and safetensors metadata must be UTF-8.
#include <optional>
#include <string>

#include "data/char_text.h"
#include "optim/checkpoint.h"

namespace dpt::train {

constexpr const char* kCharVocabKey = "train.char_vocab";

std::string encode_char_vocab(const data::CharVocab& vocab);
// Throws naming the key when `text` is not hex pairs of strictly ascending, distinct bytes.
data::CharVocab decode_char_vocab(const std::string& text);
// The vocabulary a checkpoint holds under kCharVocabKey, or nullopt when it holds none.
std::optional<data::CharVocab> checkpoint_char_vocab(const optim::Checkpoint& checkpoint);

}  // namespace dpt::train
