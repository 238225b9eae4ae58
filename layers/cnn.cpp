#include "layers/cnn.h"

#include "core/error.h"
#include "layers/activation.h"
#include "layers/conv.h"
#include "layers/linear.h"

namespace dpt::nn {

CNN::CNN(const CNNConfig& c, Generator& gen) {
  DPT_CHECK(c.height % 4 == 0 && c.width % 4 == 0, "CNN: height {} and width {} must be multiples of 4", c.height,
            c.width);
  const int64_t w = c.width_multiplier;
  push_back(std::make_shared<Conv2d>(c.in_channels, w, 3, 1, 1, true, gen));
  push_back(std::make_shared<ReLU>());
  push_back(std::make_shared<MaxPool2d>(2));
  push_back(std::make_shared<Conv2d>(w, 2 * w, 3, 1, 1, true, gen));
  push_back(std::make_shared<ReLU>());
  push_back(std::make_shared<MaxPool2d>(2));
  push_back(std::make_shared<Flatten>());
  push_back(std::make_shared<Linear>(2 * w * (c.height / 4) * (c.width / 4), c.num_classes, true, gen));
}

}  // namespace dpt::nn
