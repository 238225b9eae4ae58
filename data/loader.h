#pragma once
// Loader: turns (dataset, sampler) into a stream of batches on the training device.
//
// A dataset of tensors in memory (TensorDataset) that fits `resident_bytes` is copied to a CUDA device
// once and stays there: each batch is its rows gathered on the device, by the epoch's visiting order
// (uploaded once an epoch from page-locked memory, the host not waiting), one batch ahead on a stream of
// its own, beside the step that uses the batch before it. No host work or transfer per step; the same
// bytes as the host path. Any other dataset goes through the background thread below.
//
// A background thread walks the sampler's indices epoch after epoch, gathers batches from the
// dataset and keeps up to `prefetch` of them ready. For a CUDA device each prepared batch is copied
// into a page-locked (pinned) host buffer, and the host-to-device copy is issued on a separate copy
// stream one batch AHEAD of use: the copy of batch i+1 overlaps the compute of step i. Ordering:
//   1. the device memory of batch i+1 is allocated on the consumer's current stream, and an event
//      recorded there makes the copy stream wait (the pool may reuse memory that stream just freed);
//   2. the copy runs on the copy stream and records `copy_done`;
//   3. when next() hands batch i+1 out, the consumer's stream waits on `copy_done` (no host sync);
//   4. the worker synchronises on `copy_done` before it refills that pinned buffer.
//
// Determinism: the batches are a pure function of (dataset, sampler, epoch, batch index), whatever
// the prefetch depth or thread timing. position()/set_position() give exact resume.
#include <cstdint>
#include <memory>

#include "core/device.h"
#include "data/dataset.h"
#include "data/sampler.h"

namespace dpt::data {

struct LoaderOptions {
  int64_t batch_size = 32;
  bool drop_last = true;  // drop an epoch's final partial batch (keeps every step the same shape)
  int prefetch = 2;       // batches prepared ahead by the background thread; 0 = no thread
  Device device = Device::cpu();
  int64_t resident_bytes = int64_t{1} << 30;  // the largest TensorDataset kept on a CUDA device; 0: none
};

// The next batch next() returns: batch `batch` (0-based) of epoch `epoch`.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

class Loader {
 public:
  // Throws when the batch size is not positive or larger than what this process sees per epoch
  // (with drop_last), or when the device is CUDA in a build without CUDA.
  Loader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The batch at position(), on options.device; then advances, rolling over into the next epoch.
  // An error raised while preparing a batch (e.g. a damaged file) is rethrown here.
  Batch next();

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t batch_size() const { return options_.batch_size; }
  const Dataset& dataset() const { return *dataset_; }
  LoaderPosition position() const { return position_; }
  // Continue from `position` (e.g. from a checkpoint); anything prefetched is discarded.
  void set_position(LoaderPosition position);
  void set_epoch(int64_t epoch) { set_position({epoch, 0}); }

  // Host batch at `position`, computed directly (no thread, no device): the reference the loader
  // must reproduce, and what tests compare against.
  Batch host_batch(LoaderPosition position) const;

 private:
  struct Worker;       // the background thread and its queue
  struct DeviceStage;  // pinned buffers, copy stream and events (CUDA builds)
  struct Resident;     // the dataset's tensors on the device and the epoch's order there

  Batch resident_next();
  Tensor resident_rows(LoaderPosition p);  // batch p's rows of the epoch order (uploaded when new)
  Batch resident_batch(const Tensor& rows) const;
  void gather_resident(const Tensor& rows, const Batch& into) const;  // on the current stream

  LoaderPosition advance(LoaderPosition p) const;
  void start_worker(LoaderPosition from);
  void stop_worker();

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const Sampler> sampler_;
  LoaderOptions options_;
  int64_t batches_per_epoch_ = 0;
  LoaderPosition position_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<DeviceStage> stage_;
  std::unique_ptr<Resident> resident_;
};

}  // namespace dpt::data
