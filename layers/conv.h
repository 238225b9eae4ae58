#pragma once
// Convolution and pooling modules over NCHW images (ops in core/ops_conv.h: im2col on CPU, cuDNN on
// GPU), and Flatten to hand their output to Linear layers.
#include "layers/module.h"

namespace dpt::nn {

class Conv2d : public Module {
 public:
  // weight [out, in, k, k] and bias [out] ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in * k * k
  // (PyTorch's default), so weights load by name into torch.nn.Conv2d.
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         bool bias = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

  Tensor weight;
  Tensor bias;

 private:
  int64_t stride_, padding_;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : kernel_(kernel), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t kernel_, stride_, padding_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : kernel_(kernel), stride_(stride), padding_(padding) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t kernel_, stride_, padding_;
};

// [N, d1, d2, ...] -> [N, d1 * d2 * ...].
class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

}  // namespace dpt::nn
