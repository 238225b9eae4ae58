#pragma once
// A small CNN for image classification:
//   [conv3x3(c -> w) relu maxpool2] -> [conv3x3(w -> 2w) relu maxpool2] -> flatten -> linear(classes)
// Children "0".."7" as a torch.nn.Sequential of the same layers. Height and width must be multiples of 4.
#include "layers/sequential.h"

namespace dpt::nn {

struct CNNConfig {
  int64_t in_channels = 1;
  int64_t height = 28, width = 28;
  int64_t width_multiplier = 8;  // channels of the first conv
  int64_t num_classes = 10;
};

class CNN : public Sequential {
 public:
  explicit CNN(const CNNConfig& config, Generator& gen = default_generator());
};

}  // namespace dpt::nn
