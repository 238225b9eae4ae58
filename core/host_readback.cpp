#include "core/host_readback.h"

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace dpt {

HostReadback::HostReadback(Device device, int64_t count) : device_(device), count_(count), arrived_(device) {
  DPT_CHECK(count > 0, "HostReadback: count must be positive, got {}", count);
  if (device.is_cuda())
    host_ = static_cast<double*>(cuda::allocate_pinned(static_cast<size_t>(count) * sizeof(double)));
}

HostReadback::~HostReadback() {
  // A copy may still be on its way into the buffer.
  if (copied_) arrived_.synchronize();
  cuda::free_pinned(host_);
}

void HostReadback::copy(const Tensor& values) {
  DPT_CHECK(values.numel() == count_ && values.dtype() == DType::Float64 && values.is_contiguous() &&
                values.device() == device_,
            "HostReadback: expected {} contiguous float64 values on {}, got {} {} on {}", count_, device_.str(),
            shape_str(values.shape()), dtype_name(values.dtype()), values.device().str());
  copied_ = true;
  if (!device_.is_cuda()) {
    cpu_values_ = values.to_vector<double>();
    return;
  }
  // The previous copy must have landed before this one overwrites the buffer.
  arrived_.synchronize();
  cuda::copy_to_host_async(host_, values.data_ptr(), static_cast<size_t>(count_) * sizeof(double));
  arrived_.record();
}

std::vector<double> HostReadback::values() const {
  DPT_CHECK(copied_, "HostReadback: nothing was copied");
  if (!device_.is_cuda()) return cpu_values_;
  arrived_.synchronize();
  return std::vector<double>(host_, host_ + count_);
}

}  // namespace dpt
