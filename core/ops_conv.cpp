// conv2d / max_pool2d / avg_pool2d: shape checks, device dispatch and autograd (see core/ops_conv.h).
#include "core/ops_conv.h"

#include "core/autograd.h"
#include "core/conv_kernels.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"

namespace dpt {

namespace {

Tensor contiguous_detached(const Tensor& x) {
  NoGradGuard no_grad;
  return x.detach().contiguous();
}

#ifdef DPT_HAVE_CUDA
constexpr bool kHaveCuda = true;
#else
constexpr bool kHaveCuda = false;
#endif

void require_cuda(const char* op) {
  DPT_CHECK(kHaveCuda, "{}: CUDA tensors in a build without CUDA", op);
}

conv::Geometry conv_geometry(const Tensor& x, const Tensor& weight, int64_t stride, int64_t padding) {
  DPT_CHECK(x.dim() == 4, "conv2d: expected input [N, C, H, W], found {}", shape_str(x.shape()));
  DPT_CHECK(weight.dim() == 4 && weight.size(1) == x.size(1),
            "conv2d: weight {} does not fit input {} (expected [O, {}, kh, kw])", shape_str(weight.shape()),
            shape_str(x.shape()), x.size(1));
  DPT_CHECK(x.dtype() == weight.dtype() && x.device() == weight.device(),
            "conv2d: input is {} on {} but weight is {} on {}", dtype_name(x.dtype()), x.device().str(),
            dtype_name(weight.dtype()), weight.device().str());
  DPT_CHECK(is_floating(x.dtype()), "conv2d: expected a floating input, found {}", dtype_name(x.dtype()));
  DPT_CHECK(stride >= 1 && padding >= 0, "conv2d: need stride >= 1 and padding >= 0, got {} and {}", stride, padding);
  conv::Geometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.o = weight.size(0);
  g.kh = weight.size(2);
  g.kw = weight.size(3);
  g.stride = stride;
  g.padding = padding;
  DPT_CHECK(g.h + 2 * padding >= g.kh && g.w + 2 * padding >= g.kw,
            "conv2d: kernel {}x{} larger than the padded input {}x{}", g.kh, g.kw, g.h + 2 * padding,
            g.w + 2 * padding);
  g.ho = (g.h + 2 * padding - g.kh) / stride + 1;
  g.wo = (g.w + 2 * padding - g.kw) / stride + 1;
  return g;
}

// Differentiable im2col (CPU): its adjoint col2im is the input gradient.
Tensor im2col(const Tensor& x, const conv::Geometry& g) {
  Tensor xc = contiguous_detached(x);
  Tensor cols = Tensor::empty({g.n, g.c * g.kh * g.kw, g.ho * g.wo}, x.options());
  conv::cpu::im2col(xc, cols, g);
  record_op("Im2colBackward", {x}, {cols}, [g](const std::vector<Tensor>& grads) {
    Tensor gc = contiguous_detached(grads[0]);
    Tensor dx = Tensor::empty({g.n, g.c, g.h, g.w}, gc.options());
    conv::cpu::col2im(gc, dx, g);
    return std::vector<Tensor>{dx};
  });
  return cols;
}

Tensor conv2d_cudnn(const Tensor& x, const Tensor& weight, const conv::Geometry& g) {
  require_cuda("conv2d");
  Tensor xc = contiguous_detached(x), wc = contiguous_detached(weight);
  Tensor y = Tensor::empty({g.n, g.o, g.ho, g.wo}, x.options());
#ifdef DPT_HAVE_CUDA
  conv::cudnn::conv2d_forward(xc, wc, y, g);
#endif
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  record_op("Conv2dBackward", {x, weight}, {y}, [xc, wc, g, need_x, need_w](const std::vector<Tensor>& grads) {
    Tensor dy = contiguous_detached(grads[0]);
    Tensor dx, dw;
#ifdef DPT_HAVE_CUDA
    if (need_x) {
      dx = Tensor::empty(xc.shape(), xc.options());
      conv::cudnn::conv2d_backward_data(dy, wc, dx, g);
    }
    if (need_w) {
      dw = Tensor::empty(wc.shape(), wc.options());
      conv::cudnn::conv2d_backward_filter(xc, dy, dw, g);
    }
#endif
    return std::vector<Tensor>{dx, dw};
  });
  return y;
}

conv::Geometry pool_geometry(const char* op, const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  DPT_CHECK(x.dim() == 4, "{}: expected input [N, C, H, W], found {}", op, shape_str(x.shape()));
  DPT_CHECK(is_floating(x.dtype()), "{}: expected a floating input, found {}", op, dtype_name(x.dtype()));
  if (stride == 0) stride = kernel;
  DPT_CHECK(kernel >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel,
            "{}: need kernel >= 1, stride >= 1 and 0 <= padding <= kernel / 2, got kernel {} stride {} padding {}",
            op, kernel, stride, padding);
  conv::Geometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.o = g.c;
  g.kh = g.kw = kernel;
  g.stride = stride;
  g.padding = padding;
  DPT_CHECK(g.h + 2 * padding >= kernel && g.w + 2 * padding >= kernel, "{}: kernel {} larger than the input {}", op,
            kernel, shape_str(x.shape()));
  g.ho = (g.h + 2 * padding - kernel) / stride + 1;
  g.wo = (g.w + 2 * padding - kernel) / stride + 1;
  return g;
}

Tensor pool2d(bool max, const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  const char* op = max ? "max_pool2d" : "avg_pool2d";
  conv::Geometry g = pool_geometry(op, x, kernel, stride, padding);
  Tensor xc = contiguous_detached(x);
  Tensor y = Tensor::empty({g.n, g.c, g.ho, g.wo}, x.options());
  if (x.device().is_cuda()) {
    require_cuda(op);
#ifdef DPT_HAVE_CUDA
    conv::cudnn::pool2d_forward(max, xc, y, g);
#endif
    Tensor ys = y.detach();
    record_op(max ? "MaxPool2dBackward" : "AvgPool2dBackward", {x}, {y},
              [max, xc, ys, g](const std::vector<Tensor>& grads) {
                Tensor dy = contiguous_detached(grads[0]);
                Tensor dx = Tensor::empty(xc.shape(), xc.options());
#ifdef DPT_HAVE_CUDA
                conv::cudnn::pool2d_backward(max, xc, ys, dy, dx, g);
#endif
                return std::vector<Tensor>{dx};
              });
    return y;
  }
  if (max) {
    Tensor indices = Tensor::empty(y.shape(), TensorOptions{}.with_dtype(DType::Int64));
    conv::cpu::max_pool2d(xc, y, indices, g);
    record_op("MaxPool2dBackward", {x}, {y}, [indices, g](const std::vector<Tensor>& grads) {
      Tensor dy = contiguous_detached(grads[0]);
      Tensor dx = Tensor::empty({g.n, g.c, g.h, g.w}, dy.options());
      conv::cpu::max_pool2d_backward(dy, indices, dx, g);
      return std::vector<Tensor>{dx};
    });
  } else {
    conv::cpu::avg_pool2d(xc, y, g);
    record_op("AvgPool2dBackward", {x}, {y}, [g](const std::vector<Tensor>& grads) {
      Tensor dy = contiguous_detached(grads[0]);
      Tensor dx = Tensor::empty({g.n, g.c, g.h, g.w}, dy.options());
      conv::cpu::avg_pool2d_backward(dy, dx, g);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding) {
  conv::Geometry g = conv_geometry(x, weight, stride, padding);
  Tensor y;
  if (x.device().is_cuda()) {
    y = conv2d_cudnn(x, weight, g);
  } else {
    // [O, C*kh*kw] @ [N, C*kh*kw, Ho*Wo] -> [N, O, Ho*Wo]: one batched gemm with the weight shared.
    y = matmul(weight.reshape({g.o, g.c * g.kh * g.kw}), im2col(x, g)).reshape({g.n, g.o, g.ho, g.wo});
  }
  if (bias.defined()) {
    DPT_CHECK(bias.dim() == 1 && bias.size(0) == g.o, "conv2d: expected bias [{}], found {}", g.o,
              shape_str(bias.shape()));
    y = y + bias.reshape({g.o, 1, 1});
  }
  return y;
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return pool2d(true, x, kernel, stride, padding);
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return pool2d(false, x, kernel, stride, padding);
}

}  // namespace dpt
