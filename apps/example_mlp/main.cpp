// dpt-example-mlp: the smallest end-to-end training run. An MLP learns three interleaved spirals
// (synthetic, seeded) on the GPU when there is one, else on the CPU, printing the loss as it falls.
//
//   dpt-example-mlp [--steps N] [--lr X] [--seed S] [--device cpu|cuda]
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "data/synthetic.h"
#include "layers/losses.h"
#include "layers/mlp.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"

namespace {

struct Args {
  int steps = 500;
  double lr = 0.01;
  uint64_t seed = 0;
  std::string device;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string key = argv[i];
    DPT_CHECK(i + 1 < argc, "option {} needs a value (usage: --steps N --lr X --seed S --device cpu|cuda)", key);
    std::string value = argv[++i];
    if (key == "--steps") a.steps = std::stoi(value);
    else if (key == "--lr") a.lr = std::stod(value);
    else if (key == "--seed") a.seed = std::stoull(value);
    else if (key == "--device") a.device = value;
    else DPT_FAIL("unknown option '{}' (expected --steps, --lr, --seed or --device)", key);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args = parse(argc, argv);
    using namespace dpt;
    Device device = args.device.empty() ? (cuda::is_available() ? Device::cuda() : Device::cpu())
                                        : Device::parse(args.device);

    // 1. Data: 2-D points on three spiral arms, all on the device (full-batch training).
    data::ClassificationOptions options;
    options.num_samples = 1500;
    options.kind = "spirals";
    options.noise = 0.1;
    options.seed = args.seed;
    auto dataset = data::make_synthetic_classification(options);
    Tensor x = dataset->inputs().to(device);
    Tensor y = dataset->targets().to(device);

    // 2. Model and optimizer, initialized from the seed.
    Generator gen(args.seed);
    nn::MLP model({2, 64, 64, 3}, "relu", gen);
    model.to(device);
    optim::AdamOptions adam;
    adam.lr = args.lr;
    optim::AdamW optimizer(optim::weight_decay_groups(model.named_parameters(), 1e-4), adam);
    optim::WarmupCosineLr schedule(args.lr, args.steps / 20, args.steps, args.lr / 10);
    spdlog::info("training an MLP ({} parameters) on {} spiral points on {}", model.num_parameters(), x.size(0),
                 device.str());

    // 3. The loop: forward, loss, backward, clip, step.
    auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < args.steps; ++step) {
      optimizer.set_lr(schedule.lr(step));
      optimizer.zero_grad();
      Tensor loss = nn::cross_entropy_loss(model.forward(x), y);
      loss.backward();
      double norm = optim::clip_grad_norm(model.parameters(), 1.0);
      optimizer.step();
      if (step % 50 == 0 || step == args.steps - 1) {
        spdlog::info("step {:5d}  loss {:.4f}  grad norm {:.3f}  lr {:.2e}", step, loss.item(), norm,
                     schedule.lr(step));
      }
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // 4. Accuracy on the training points.
    auto predicted = argmax(model.forward(x), 1).to_vector<int64_t>();
    auto truth = y.to_vector<int64_t>();
    int64_t right = 0;
    for (size_t i = 0; i < truth.size(); ++i) right += predicted[i] == truth[i];
    spdlog::info("accuracy {:.1f}% after {} steps in {:.2f} s", 100.0 * right / truth.size(), args.steps, seconds);
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
