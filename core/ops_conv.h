#pragma once
// Convolution and pooling over NCHW images. CPU: im2col + matmul (the matmul op carries the weight
// and column gradients; col2im carries the input gradient). CUDA: cuDNN, with deterministic backward
// algorithms. All record autograd like the ops in ops.h.
#include "core/tensor.h"

namespace dpt {

// x [N, C, H, W], weight [O, C, kh, kw], bias [O] or undefined -> [N, O, Ho, Wo] with
// Ho = (H + 2 padding - kh) / stride + 1 (likewise Wo). Cross-correlation, as torch.nn.Conv2d.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, int64_t stride = 1,
              int64_t padding = 0);
// Max over kernel x kernel windows (padding counts as -inf); gradient to the first maximum.
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = 0, int64_t padding = 0);  // stride 0 = kernel
// Mean over kernel x kernel windows, zero padding counted in the divisor (PyTorch's default).
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = 0, int64_t padding = 0);

}  // namespace dpt
