#pragma once
// Builds the training and validation datasets a config names through its registry entry
// (apps/train/components.h), and reports what the model needs to know about them (input width, classes,
// vocabulary). Nothing is downloaded: synthetic data is generated from the seed, synthetic token files
// are written on first use.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "config.h"
#include "data/char_text.h"
#include "data/dataset.h"

namespace dpt::train {

// What the model factory reads off the data.
struct DataShape {
  bool tokens = false;       // next-token batches: input/target int32 [B, T]
  bool images = false;       // input float32 [B, C, H, W]
  bool regression = false;   // targets float32 [B, outputs] (else class ids)
  int64_t num_features = 0;  // flat input width (C*H*W for images)
  int64_t num_outputs = 0;   // classes, or regression outputs
  int64_t channels = 0, height = 0, width = 0;
  int64_t vocab_size = 0;  // token data: ids are below this
  int64_t seq_len = 0;
};

struct DataBundle {
  std::shared_ptr<const data::Dataset> train;
  std::shared_ptr<const data::Dataset> val;  // null when nothing is held out
  DataShape shape;
  std::optional<data::CharVocab> vocab;  // text data: decodes samples
};

// Throws dpt::Error naming the file or key at fault.
DataBundle make_data(const Config& config);

}  // namespace dpt::train
