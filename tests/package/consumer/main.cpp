// Fits y = 3x - 2 with one Linear layer and SGD: exit 0 once the weights are found.
#include <cmath>
#include <cstdio>

#include <dptrain.h>

int main() {
  using namespace dpt;
  Generator gen(0);
  Tensor x = randn({64, 1}, gen);
  Tensor y = x * 3.0 - 2.0;
  nn::Linear layer(1, 1, /*bias=*/true, gen);
  optim::SgdOptions options;
  options.lr = 0.1;
  optim::SGD sgd(layer.named_parameters(), options);
  for (int step = 0; step < 200; ++step) {
    sgd.zero_grad();
    Tensor loss = mse_loss(layer.forward(x), y);
    loss.backward();
    sgd.step();
  }
  const float w = layer.weight.item(), b = layer.bias.item();
  std::printf("w %.4f b %.4f\n", w, b);
  return std::fabs(w - 3) < 1e-3 && std::fabs(b + 2) < 1e-3 ? 0 : 1;
}
