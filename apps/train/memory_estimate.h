#pragma once
// Whether a training job fits in memory, decided from the config before the model is allocated: a model
// that cannot fit should be refused with the numbers and the keys that set them, not die in
// std::bad_alloc or grow until the kernel's OOM killer ends it.
//
// The estimate is meant to be a little above what a step really needs, never far below it:
//   weights      parameters x the compute dtype's size
//   masters      parameters x 4 under mixed precision (float32 master weights)
//   gradients    parameters x the compute dtype's size, plus x 4 for the masters' under mixed precision
//   optimizer    parameters x 8 (Adam/AdamW moments) or x 4 (SGD with momentum), float32
//   buckets      parameters x the compute dtype's size with several processes (DDP's flat gradients)
//   activations  what backward keeps for one micro-batch (training.batch_size)
// Parameters and activations come from the model's registry entry (ModelFactory::estimate in
// apps/train/components.h), which counts them from the config (the same layers its factory builds), so
// nothing is allocated to count them. A model without an estimate is not checked.
#include <cstdint>
#include <string>

#include "config.h"
#include "core/device.h"
#include "core/dtype.h"
#include "data_factory.h"

namespace dpt::train {

struct MemoryEstimate {
  int64_t parameters = 0;
  double weights = 0, masters = 0, gradients = 0, optimizer = 0, buckets = 0, activations = 0;  // bytes
  double total() const { return weights + masters + gradients + optimizer + buckets + activations; }
};

// The estimate for one process training `config` on data of `shape` with compute dtype `compute` on
// `device`, one of `world_size` processes. `keys` (optional) receives the config keys that set the size,
// with their values.
MemoryEstimate estimate_training_memory(const Config& config, const DataShape& shape, DType compute,
                                        const Device& device, int world_size, std::string* keys = nullptr);

// Bytes this process may still use on `device`: a GPU's free memory (cudaMemGetInfo); on the CPU,
// MemAvailable (or the cgroup's remaining limit when lower) shared by `local_processes` processes.
// `where` is set to a description ("cuda:0 (NVIDIA H100 80GB HBM3) has 79.1 GiB free").
double available_memory(const Device& device, int local_processes, std::string* where);

// Throws a dpt::Error with the estimate, what is available, and the config keys to change when the
// estimate exceeds what is available. DPT_MEMORY_CHECK=0 in the environment skips the check (for a
// configuration the estimate misjudges).
void check_memory_fits(const Config& config, const DataShape& shape, DType compute, const Device& device,
                       int local_processes, int world_size);

// "1.5 GiB", "824.0 GiB", "3.2 TiB".
std::string human_bytes(double bytes);

}  // namespace dpt::train
