#include "layers/conv.h"

#include "core/error.h"
#include "core/ops_conv.h"
#include "layers/init.h"

namespace dpt::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding,
               bool with_bias, Generator& gen)
    : stride_(stride), padding_(padding) {
  DPT_CHECK(in_channels > 0 && out_channels > 0 && kernel > 0, "Conv2d: channels and kernel must be positive");
  const int64_t fan_in = in_channels * kernel * kernel;
  weight = register_parameter("weight", Tensor::empty({out_channels, in_channels, kernel, kernel}));
  init::fan_in_uniform_(weight, gen, fan_in);
  if (with_bias) {
    bias = register_parameter("bias", Tensor::empty({out_channels}));
    init::fan_in_uniform_(bias, gen, fan_in);
  }
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, stride_, padding_); }

Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, kernel_, stride_, padding_); }

Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, kernel_, stride_, padding_); }

Tensor Flatten::forward(const Tensor& x) {
  DPT_CHECK(x.dim() >= 1, "Flatten: expected a batch dimension");
  return x.reshape({x.size(0), -1});
}

}  // namespace dpt::nn
