// dpt-example-ddp: data-parallel training in one short file, the way a PyTorch DDP script reads.
// Every process holds the whole model; each trains on its own shard of the points; DDP averages the
// gradients during backward, so all replicas take the same step. Run it on the CPU or the GPUs:
//
//   dpt-run --nproc-per-node 2 dpt-example-ddp          (two processes: Gloo on CPUs, NCCL on GPUs)
//   dpt-example-ddp                                    (one process: the same run without a launcher)
//
// The shards are equal and the loss is a mean, so the average of the shards' gradients is the gradient
// of the whole batch: every world size follows the same trajectory as one process, up to the order in
// which floating-point sums are taken.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "dptrain.h"

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel training of an MLP on three spirals; start it with dpt-run for several processes."};
  int steps = 300;
  double lr = 0.01;
  uint64_t seed = 0;
  std::string device_name;
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "AdamW's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "data, initialization and shuffling seed");
  app.add_option("--device", device_name, "cpu or cuda (default: the local rank's GPU when there is one)");
  app.footer("Examples:\n  dpt-run --nproc-per-node 2 dpt-example-ddp --steps 200\n  dpt-example-ddp --device cpu");
  CLI11_PARSE(app, argc, argv);

  using namespace dpt;
  try {
    // 1. Where this process stands: rank and world size from the launcher (world 1 without one).
    const dist::DistEnv env = dist::read_dist_env();
    const Device device = !device_name.empty()   ? Device::parse(device_name)
                          : cuda::is_available() ? Device::cuda(env.local_rank)
                                                 : Device::cpu();
    if (device.is_cuda()) cuda::set_device(device.index);
    std::shared_ptr<dist::ProcessGroup> group;
    if (env.world_size > 1) group = dist::init_process_group(env);

    // 2. This rank's shard of the data: the sampler deals indices round-robin, the same on every rank.
    data::ClassificationOptions points;
    points.num_samples = 1536;
    points.kind = "spirals";
    points.noise = 0.1;
    points.seed = seed;
    auto dataset = data::make_synthetic_classification(points);
    dist::DistributedSampler sampler(dataset->size(), env.rank, env.world_size, {.shuffle = true, .seed = seed});
    data::Batch shard = dataset->get_batch(sampler.epoch_indices(0));
    Tensor x = shard.input.to(device), y = shard.target.to(device);

    // 3. The model, the same on every rank (DDP also broadcasts rank 0's parameters), wrapped in DDP.
    Generator gen(seed);
    auto model = std::make_shared<nn::MLP>(std::vector<int64_t>{2, 64, 64, 3}, "relu", gen);
    model->to(device);
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    if (group) ddp = std::make_unique<dist::DistributedDataParallel>(model, group);
    optim::AdamOptions adam;
    adam.lr = lr;
    optim::AdamW optimizer(optim::weight_decay_groups(model->named_parameters(), 1e-4), adam);
    if (env.rank == 0) {
      spdlog::info("{} process(es), {} points each, an MLP of {} parameters on {}", env.world_size, x.size(0),
                   model->num_parameters(), device.str());
    }

    // 4. The loop: forward, loss, backward (DDP averages the gradients as they become ready), step.
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      Tensor loss = nn::cross_entropy_loss(model->forward(x), y);
      loss.backward();
      optimizer.step();
      if (step % 50 == 0 || step == steps - 1) {
        // The loss of the whole batch: the mean of the ranks' equal-sized shard losses.
        Tensor mean = loss.detach().to(DType::Float32).clone().reshape({1});
        if (group) group->allreduce(mean, dist::ReduceOp::Avg)->wait();
        if (env.rank == 0) spdlog::info("step {:4d}  loss {:.6f}", step, mean.item());
      }
    }
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    dist::report_error_to_launcher(e.what());
    return 1;
  }
}
