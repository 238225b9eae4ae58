#include "bench_util.h"

#include <algorithm>
#include <chrono>

#include "core/cuda_runtime.h"
#ifdef DPT_HAVE_CUDA
#include "core/cuda/stream.h"
#endif

namespace dpt::bench {

double median_ms(int warmup, int iters, const Device& device, const std::function<void()>& run) {
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> ms;
#ifdef DPT_HAVE_CUDA
  if (device.is_cuda()) {
    std::vector<cuda::CudaEvent> events;
    for (int i = 0; i < 2 * iters; ++i) events.emplace_back(true, device.index);
    for (int i = 0; i < iters; ++i) {
      events[2 * static_cast<size_t>(i)].record();
      run();
      events[2 * static_cast<size_t>(i) + 1].record();
    }
    events.back().synchronize();
    for (int i = 0; i < iters; ++i) {
      ms.push_back(events[2 * static_cast<size_t>(i)].elapsed_ms(events[2 * static_cast<size_t>(i) + 1]));
    }
  }
#endif
  if (!device.is_cuda()) {
    for (int i = 0; i < iters; ++i) {
      const auto start = std::chrono::steady_clock::now();
      run();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace dpt::bench
