// dpt-example-mlp: the smallest end-to-end training run. An MLP learns three interleaved spirals
// (synthetic, seeded) on the GPU when there is one, else on the CPU, printing the loss as it falls.
//
//   dpt-example-mlp [--steps N] [--lr X] [--seed S] [--device cpu|cuda]
// Exit codes: 0 done; 1 error; 2 usage.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "command_line.h"
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

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{
      "The smallest end-to-end training run: an MLP learns three interleaved spirals, on the GPU when there "
      "is one, else on the CPU.",
      "dpt-example-mlp"};
  app.add_option("--steps", args.steps, "full-batch training steps")
      ->check(dpt::cli::at_least(1))
      ->capture_default_str();
  app.add_option("--lr", args.lr, "peak learning rate (warm-up, then cosine decay)")
      ->check(dpt::cli::number_in(0, 1e3))
      ->capture_default_str();
  app.add_option("--seed", args.seed, "seed of the data and the weights")
      ->check(dpt::cli::at_least(0))
      ->capture_default_str();
  app.add_option("--device", args.device, "cpu, cuda or cuda:N (default: cuda when there is a GPU)");
  dpt::cli::set_examples(app, {"dpt-example-mlp", "dpt-example-mlp --steps 200 --lr 0.02 --device cpu"});
  if (auto code = dpt::cli::parse(app, argc, argv)) return *code;
  try {
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
