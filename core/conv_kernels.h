#pragma once
// Kernels behind core/ops_conv.h: CPU im2col/col2im and pooling (core/cpu/conv.cpp) and cuDNN
// convolution and pooling (core/cuda/conv_cudnn.cu, CUDA builds only). Tensors are contiguous NCHW.
#include <cstdint>

#include "core/tensor.h"

namespace dpt::conv {

struct Geometry {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t o = 0;                       // output channels (convolution) or c (pooling)
  int64_t kh = 0, kw = 0, stride = 1, padding = 0;
  int64_t ho = 0, wo = 0;              // output spatial size
};

namespace cpu {
// cols [N, C*kh*kw, Ho*Wo]: row (c, i, j) holds x[c, oh*stride - pad + i, ow*stride - pad + j] (0 outside).
void im2col(const Tensor& x, const Tensor& cols, const Geometry& g);
// dx (zeroed here) += the columns scattered back: the adjoint of im2col.
void col2im(const Tensor& cols, const Tensor& dx, const Geometry& g);
// y [N, C, Ho, Wo]; indices int64 [N, C, Ho, Wo] = argmax position h*W + w within the input plane.
void max_pool2d(const Tensor& x, const Tensor& y, const Tensor& indices, const Geometry& g);
void max_pool2d_backward(const Tensor& dy, const Tensor& indices, const Tensor& dx, const Geometry& g);
void avg_pool2d(const Tensor& x, const Tensor& y, const Geometry& g);
void avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Geometry& g);
}  // namespace cpu

namespace cudnn {
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Geometry& g);
void conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Geometry& g);
void conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw, const Geometry& g);
void pool2d_forward(bool max, const Tensor& x, const Tensor& y, const Geometry& g);
void pool2d_backward(bool max, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                     const Geometry& g);
}  // namespace cudnn

}  // namespace dpt::conv
