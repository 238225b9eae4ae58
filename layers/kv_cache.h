#pragma once
// The keys and values of the positions a GPT has already seen, per layer, so that sampling feeds the
// model only the newest token: its projections and MLP cost one position, and attention reads the
// cached keys and values instead of recomputing them for the whole prefix.
//
// Each layer's buffers are [block_size, B, H, D], position-major, so the first `length` positions are
// one contiguous slice and a new position is one contiguous copy. GPT::forward_cached allocates them on
// its first call, in the model's dtype and on its device.
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dpt::nn {

struct KvCache {
  struct Layer {
    Tensor keys, values;
  };
  std::vector<Layer> layers;
  int64_t length = 0;  // positions held
};

}  // namespace dpt::nn
