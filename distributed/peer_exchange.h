#pragma once
// Gradient averaging over copy engines, for ranks whose GPUs share one host and can reach each other's
// memory (NVLink or PCIe peer access). DistributedDataParallel uses it instead of NCCL's AllReduce
// when every rank qualifies (DDPOptions::grad_exchange).
//
// Why: an NCCL AllReduce is a kernel. Launched while backward's GEMMs fill every SM, its blocks wait for
// SMs to free up and then slow the GEMMs down; on 2 GPUs that interference, not the wire, is what
// costs. Here the bytes move by DMA (cudaMemcpyAsync between mapped peer buffers), and the SMs only
// run one short averaging kernel per bucket.
//
// Each rank allocates one block of device memory (cudaMalloc, so CUDA IPC can export it) holding
// every bucket's gradient buffer, a receive area per bucket and a row of flags, and maps every peer's
// block. Bucket b of n elements is cut into `world` chunks; rank r owns chunk r. Averaging bucket b,
// all on this rank's exchange stream, after the compute stream's gradients:
//   1. copy chunk p of our buffer into peer p's receive area, for every peer p; then write our
//      sequence number into peer p's `arrived[me]` flag;
//   2. wait until `arrived[q]` reached the sequence number for every peer q (cuStreamWaitValue32: the
//      stream stalls in the front end, no SM spins), then average chunk `me` with the received copies;
//   3. copy our averaged chunk into chunk `me` of every peer's buffer; then write `done[me]` there;
//   4. wait for `done[q]` from every peer: every chunk of the bucket is averaged in our buffer.
// Stream order on every rank makes the buffers safe to reuse: a peer writes into our receive area
// only after step 4 of the previous use of that bucket, which waited for our step 3, which followed
// our step 2's read of it. Sequence numbers grow by one per averaged bucket on every rank (DDP issues
// buckets in the same order everywhere), so a flag never needs resetting.
//
// A rank that dies mid-step leaves its peers' streams waiting; the launcher (dpt-run) ends the job
// when any rank exits, as it does for NCCL.
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/process_group.h"
#include "distributed/work.h"

namespace dpt::dist {

struct ExchangeBucket {
  int64_t numel = 0;
  DType dtype = DType::Float32;
};

class PeerExchange {
 public:
  // Collective over `group`. True on every rank when every rank runs on a CUDA device of the same host,
  // every pair of those devices has peer access, and the world is 2..8 ranks; false on every rank
  // otherwise, with the reason in *why_not (when given).
  static bool available(ProcessGroup& group, int device, std::string* why_not = nullptr);

  // Collective: allocates this rank's block, publishes its IPC handle under `key` in the group's
  // store, and maps every peer's block. dtypes: float32, bfloat16, float16.
  PeerExchange(std::shared_ptr<ProcessGroup> group, const std::vector<ExchangeBucket>& buckets, int device,
               const std::string& key);
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  // Bucket b's flat gradient buffer, inside the shared block (DDP's GradBucket::buffer).
  Tensor buffer(size_t bucket) const;
  // Averages buffer(bucket) over the ranks in place, ordered after the current stream's work. The
  // returned Work's wait() makes the current stream wait for it (no host synchronisation).
  std::shared_ptr<Work> average(size_t bucket);

  // Chunk c of a bucket of n elements, as [begin, end): boundaries on multiples of 64 elements so
  // every chunk starts 16-byte aligned. Pure; exposed for tests.
  static int64_t chunk_begin(int64_t n, int world, int c);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpt::dist
