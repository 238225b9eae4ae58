#pragma once
// Tensor creation. Random tensors come from a counter-based generator (Philox-4x32-10): element i of a
// draw is a pure function of (seed, offset + i), so the same seed gives the same numbers on CPU and
// GPU, in any launch configuration.
#include <cstdint>
#include <functional>
#include <vector>

#include "core/kernel_types.h"
#include "core/tensor.h"

namespace dpt {

Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
Tensor full(const Shape& shape, double value, const TensorOptions& options = {});
Tensor arange(int64_t end, const TensorOptions& options = {});  // 0, 1, ..., end-1
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor scalar_tensor(double value, const TensorOptions& options = {});  // shape []
// A contiguous tensor over memory the caller allocated on options.device (like torch.from_blob);
// `release` frees it when the last tensor sharing it goes away.
Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options, std::function<void(void*)> release);

// A host vector copied into a tensor of `shape` (numel must match) on options.device.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, const TensorOptions& options = {});

// A random stream: each draw consumes `numel` counters, so successive draws differ and the
// state (seed, offset) is all that a checkpoint needs to save.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed; offset_ = offset; }
  // The offset of a draw of `count` numbers, moving the stream past them (not while capturing).
  uint64_t advance(uint64_t count);
  // A draw of `count` numbers for a kernel taking PhiloxArgs. While a CUDA graph is being captured the
  // draw is relative to the device counter given to begin_capture.
  PhiloxArgs draw(uint64_t count);

  // CUDA graph capture. `device_counter` holds offset() when the first replay runs and must be moved on
  // by end_capture()'s count at the end of every replay (kernels::advance_counter in the graph); the host
  // then calls skip(count) after each replay, so offset() stays the counter's value (what a checkpoint
  // saves).
  void begin_capture(const uint64_t* device_counter);
  uint64_t end_capture();  // numbers one replay draws
  void skip(uint64_t count) { offset_ += count; }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
  const uint64_t* capture_counter_ = nullptr;
  uint64_t captured_ = 0;  // numbers drawn since begin_capture
};

Generator& default_generator();
void manual_seed(uint64_t seed);

Tensor randn(const Shape& shape, Generator& gen, const TensorOptions& options = {}, double mean = 0,
             double stddev = 1);
Tensor rand(const Shape& shape, Generator& gen, const TensorOptions& options = {}, double low = 0,
            double high = 1);
Tensor randint(const Shape& shape, int64_t low, int64_t high, Generator& gen, const TensorOptions& options = {});
// In-place initializers (no autograd): fill `t` with a fresh draw.
void normal_(const Tensor& t, Generator& gen, double mean, double stddev);
void uniform_(const Tensor& t, Generator& gen, double low, double high);

}  // namespace dpt
