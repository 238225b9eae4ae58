#include "core/cuda/copy.h"

#include "core/cuda/check.h"
#include "core/cuda/stream.h"

namespace dpt::cuda_kernels {

void copy_between_devices(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  DPT_CHECK(dst_device.is_cuda() || src_device.is_cuda(), "copy_between_devices: {} -> {} involves no CUDA device",
            src_device.str(), dst_device.str());
  if (src_device.is_cuda() && dst_device.is_cuda() && src_device.index != dst_device.index) {
    // Peer copy on the source's stream, fenced on both sides: it starts after the work already queued
    // on the destination's stream (which may still use the block just allocated there) and the
    // destination's later work waits for it. No host synchronisation.
    cuda::DeviceGuard guard(src_device.index);
    cudaStream_t src_stream = cuda::current_stream(src_device.index);
    cudaStream_t dst_stream = cuda::current_stream(dst_device.index);
    cuda::CudaEvent dst_ready(false, dst_device.index);
    dst_ready.record(dst_stream);
    dst_ready.wait(src_stream);
    DPT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, src_stream));
    cuda::CudaEvent done(false, src_device.index);
    done.record(src_stream);
    done.wait(dst_stream);
    return;
  }
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  // cudaMemcpyDefault: unified addressing tells the direction from the pointers themselves.
  DPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream));
  if (dst_device.is_cpu() || src_device.is_cpu()) {
    // The host buffer may be pageable or go out of scope right after we return.
    DPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

}  // namespace dpt::cuda_kernels
