#pragma once
// DPT_KERNEL_DISPATCH(device, fn, args...): calls dpt::cuda_kernels::fn(args...) for a CUDA device and
// dpt::cpu::fn(args...) otherwise. Both declarations must be visible (core/kernel_decls.inc, or a fused
// op's own kernel header). The CUDA call runs under a device guard, so kernels land on the tensor's device
// whatever device the thread has current (like PyTorch's device guard), and under the kernel profiler
// (core/kernel_profiler.h) as `fn`. The guard and timer are temporaries of the full expression: they live
// until the kernel call returns.
#include "core/kernel_profiler.h"

#ifdef DPT_HAVE_CUDA
#include "core/cuda/stream.h"
#define DPT_KERNEL_DISPATCH(device, fn, ...)                                                      \
  ((device).is_cuda() ? (::dpt::cuda::DeviceGuard((device).index), ::dpt::KernelTimer(#fn, true), \
                         ::dpt::cuda_kernels::fn(__VA_ARGS__))                                    \
                      : ::dpt::cpu::fn(__VA_ARGS__))
#else
#define DPT_KERNEL_DISPATCH(device, fn, ...) ::dpt::cpu::fn(__VA_ARGS__)
#endif
