// Convolution and pooling: direct-loop known answers, float64 gradient checks, and a CNN that learns.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/ops_conv.h"
#include "layers/cnn.h"
#include "layers/conv.h"
#include "layers/losses.h"
#include "optim/adam.h"
#include "param_gradcheck.h"

namespace dpt::nn {
namespace {

using dpt::testing::expect_param_gradients_match;
using dpt::testing::leaf64;

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

// The definition, one output at a time.
std::vector<double> naive_conv(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                               int n, int c, int h, int wd, int o, int k, int stride, int pad, int* ho, int* wo) {
  *ho = (h + 2 * pad - k) / stride + 1;
  *wo = (wd + 2 * pad - k) / stride + 1;
  std::vector<double> y(static_cast<size_t>(n * o * *ho * *wo));
  for (int in = 0; in < n; ++in)
    for (int oc = 0; oc < o; ++oc)
      for (int oh = 0; oh < *ho; ++oh)
        for (int ow = 0; ow < *wo; ++ow) {
          double s = b[static_cast<size_t>(oc)];
          for (int ic = 0; ic < c; ++ic)
            for (int i = 0; i < k; ++i)
              for (int j = 0; j < k; ++j) {
                int ih = oh * stride - pad + i, iw = ow * stride - pad + j;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                s += x[static_cast<size_t>(((in * c + ic) * h + ih) * wd + iw)] *
                     w[static_cast<size_t>(((oc * c + ic) * k + i) * k + j)];
              }
          y[static_cast<size_t>(((in * o + oc) * *ho + oh) * *wo + ow)] = s;
        }
  return y;
}

TEST(Conv, Conv2dMatchesTheDefinition) {
  Generator gen(1);
  for (auto [stride, pad] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{1, 2}}) {
    Tensor x = randn({2, 3, 7, 6}, gen, kF64), w = randn({4, 3, 3, 3}, gen, kF64), b = randn({4}, gen, kF64);
    int ho, wo;
    auto expected = naive_conv(x.to_vector<double>(), w.to_vector<double>(), b.to_vector<double>(), 2, 3, 7, 6, 4, 3,
                               stride, pad, &ho, &wo);
    Tensor y = conv2d(x, w, b, stride, pad);
    ASSERT_EQ(y.shape(), (Shape{2, 4, ho, wo}));
    auto got = y.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-12) << i;
  }
  EXPECT_THROW(conv2d(zeros({1, 2, 4, 4}), zeros({1, 3, 3, 3})), Error);
  EXPECT_THROW(conv2d(zeros({1, 2, 2, 2}), zeros({1, 2, 3, 3})), Error);
}

TEST(Conv, PoolingKnownAnswers) {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {1, 1, 4, 4});
  EXPECT_EQ(max_pool2d(x, 2).to_vector<float>(), (std::vector<float>{6, 8, 14, 16}));
  EXPECT_EQ(avg_pool2d(x, 2).to_vector<float>(), (std::vector<float>{3.5f, 5.5f, 11.5f, 13.5f}));
  // Padding: max ignores it, average counts it as zeros in the divisor.
  EXPECT_EQ(max_pool2d(x, 2, 2, 1).to_vector<float>(), (std::vector<float>{1, 3, 4, 9, 11, 12, 13, 15, 16}));
  EXPECT_FLOAT_EQ(avg_pool2d(x, 2, 2, 1).to_vector<float>()[0], 0.25f);
  EXPECT_THROW(max_pool2d(x, 2, 2, 2), Error);  // padding > kernel / 2
}

TEST(Conv, GradientsOfConvAndPools) {
  Generator gen(2);
  Tensor x = leaf64({2, 2, 5, 5}, gen), w = leaf64({3, 2, 3, 3}, gen), b = leaf64({3}, gen);
  expect_param_gradients_match([&] { return conv2d(x, w, b, 2, 1); }, {{"x", x}, {"w", w}, {"b", b}});
  Tensor p = leaf64({2, 2, 6, 6}, gen);
  expect_param_gradients_match([&] { return max_pool2d(p, 3, 2, 1); }, {{"p", p}});
  expect_param_gradients_match([&] { return avg_pool2d(p, 2, 2, 1); }, {{"p", p}});
}

TEST(Conv, CnnModuleGradients) {
  Generator gen(3);
  CNNConfig cfg;
  cfg.in_channels = 2;
  cfg.height = cfg.width = 4;
  cfg.width_multiplier = 2;
  cfg.num_classes = 3;
  CNN cnn(cfg, gen);
  cnn.to(DType::Float64);
  Tensor x = leaf64({2, 2, 4, 4}, gen);
  NamedTensors wrt = cnn.named_parameters();
  wrt.emplace_back("x", x);
  expect_param_gradients_match([&] { return cnn.forward(x); }, wrt);
  EXPECT_EQ(cnn.named_parameters()[0].first, "0.weight");
  EXPECT_EQ(cnn.named_parameters().back().first, "7.bias");
}

// 8x8 images of one bright bar at a random place: horizontal (class 0), vertical (1), or a diagonal
// (2), on noise. Position varies, so the network needs translation-invariant features.
void make_bars(int64_t n, Tensor* x, Tensor* y, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> img = randn({n, 1, 8, 8}, gen, {}, 0.0, 0.3).to_vector<float>();
  std::vector<int64_t> pos = randint({n, 2}, 0, 6, gen, TensorOptions{}.with_dtype(DType::Int64)).to_vector<int64_t>();
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    int64_t cls = i % 3, r = pos[static_cast<size_t>(2 * i)], c = pos[static_cast<size_t>(2 * i + 1)];
    for (int64_t t = 0; t < 3; ++t) {
      int64_t rr = cls == 0 ? r : r + t, cc = cls == 1 ? c : c + t;
      img[static_cast<size_t>(i * 64 + rr * 8 + cc)] += 2.0f;
    }
    labels.push_back(cls);
  }
  *x = from_vector(img, {n, 1, 8, 8});
  *y = from_vector(labels, {n}, TensorOptions{}.with_dtype(DType::Int64));
}

TEST(Conv, SmallCnnLearnsBars) {
  Tensor x, y, xt, yt;
  make_bars(96, &x, &y, 1);
  make_bars(60, &xt, &yt, 2);
  Generator gen(4);
  CNNConfig cfg;
  cfg.height = cfg.width = 8;
  cfg.width_multiplier = 4;
  cfg.num_classes = 3;
  CNN cnn(cfg, gen);
  optim::AdamOptions o;
  o.lr = 0.01;
  optim::Adam opt(cnn.named_parameters(), o);
  double first = 0, last = 0;
  for (int step = 0; step < 80; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy_loss(cnn.forward(x), y);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item();
    last = loss.item();
  }
  EXPECT_LT(last, 0.25 * first);
  auto pred = argmax(cnn.forward(xt), 1).to_vector<int64_t>();
  auto truth = yt.to_vector<int64_t>();
  int right = 0;
  for (size_t i = 0; i < pred.size(); ++i) right += pred[i] == truth[i];
  EXPECT_GE(right, 54) << "held-out accuracy " << right << "/60";
}

}  // namespace
}  // namespace dpt::nn
