#include "distributed/peer_exchange.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/factory.h"

#ifdef DPT_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "distributed/peer_average.h"
#endif

namespace dpt::dist {

int64_t PeerExchange::chunk_begin(int64_t n, int world, int c) {
  if (c >= world) return n;
  constexpr int64_t kAlign = 64;  // elements: 16-byte aligned chunks for every supported dtype
  return std::min(n, n / world * c / kAlign * kAlign);
}

#ifdef DPT_HAVE_CUDA
namespace {

// Where a process runs: two ranks share a host when both strings match (the boot id tells apart
// containers on different machines that happen to share a hostname).
std::string host_identity() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return std::string(name) + "/" + boot_id;
}

// A fresh namespace for each collective call of this kind: every rank counts its own calls, and the
// k-th call on every rank gets the same number.
std::string next_call_key(Store& store, int rank, const std::string& what) {
  int64_t n = store.add("peer_exchange/" + what + "/calls/" + std::to_string(rank), 1);
  return "peer_exchange/" + what + "/" + std::to_string(n) + "/";
}

}  // namespace
#endif  // DPT_HAVE_CUDA

#ifndef DPT_HAVE_CUDA

bool PeerExchange::available(ProcessGroup&, int, std::string* why_not) {
  if (why_not) *why_not = "this build has no CUDA";
  return false;
}
struct PeerExchange::Impl {};
PeerExchange::PeerExchange(std::shared_ptr<ProcessGroup>, const std::vector<ExchangeBucket>&, int, const std::string&) {
  DPT_FAIL("PeerExchange: this build has no CUDA");
}
PeerExchange::~PeerExchange() = default;
Tensor PeerExchange::buffer(size_t) const { DPT_FAIL("PeerExchange: this build has no CUDA"); }
std::shared_ptr<Work> PeerExchange::average(size_t) { DPT_FAIL("PeerExchange: this build has no CUDA"); }

#else

namespace {

// arrived[kMaxPeerRanks], done[kMaxPeerRanks], outbox[2][kMaxPeerRanks] (see Impl::signal), padding.
constexpr size_t kFlagBytes = 256;
static_assert(4 * kMaxPeerRanks * sizeof(uint32_t) <= kFlagBytes, "flag rows must fit their area");
constexpr size_t kAlignBytes = 256;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Stream memory operations live in the driver API. They are looked up through the runtime so the
// binaries keep starting on machines without a driver (CI): nothing links libcuda.
struct StreamMemOps {
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
};

const StreamMemOps& stream_mem_ops() {
  static const StreamMemOps ops = [] {
    StreamMemOps o;
    cudaDriverEntryPointQueryResult found{};
    DPT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&o.wait), 12000,
                                                    cudaEnableDefault, &found));
    DPT_CHECK(found == cudaDriverEntryPointSuccess && o.wait, "PeerExchange: the driver has no cuStreamWaitValue32");
    DPT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", reinterpret_cast<void**>(&o.write), 12000,
                                                    cudaEnableDefault, &found));
    DPT_CHECK(found == cudaDriverEntryPointSuccess && o.write, "PeerExchange: the driver has no cuStreamWriteValue32");
    return o;
  }();
  return ops;
}

void check_driver(CUresult status, const char* what) {
  DPT_CHECK(status == CUDA_SUCCESS, "PeerExchange: {} failed (CUresult {})", what, static_cast<int>(status));
}

// The block this rank allocated; tensors over it (bucket buffers, gradients that are views of them)
// share its ownership, so it outlives the exchange if they do.
struct OwnedBlock {
  char* ptr = nullptr;
  int device = 0;
  ~OwnedBlock() {
    cuda::DeviceGuard guard(device);
    cudaFree(ptr);  // a destructor: nothing to report to
  }
};

class ExchangeWork : public Work {
 public:
  ExchangeWork(cuda::CudaEvent end, int device, std::string description)
      : end_(std::move(end)), device_(device), description_(std::move(description)) {}
  void wait() override {
    cuda::DeviceGuard guard(device_);
    end_.wait(cuda::current_stream(device_));
  }
  bool is_completed() override { return end_.query(); }
  void synchronize() override {
    end_.synchronize();
    wait();
  }
  std::string describe() const override { return description_; }

 private:
  cuda::CudaEvent end_;
  int device_;
  std::string description_;
};

}  // namespace

bool PeerExchange::available(ProcessGroup& group, int device, std::string* why_not) {
  Store& store = *group.store();
  const int world = group.size(), rank = group.rank();
  const std::string key = next_call_key(store, rank, "available");
  auto fail = [&](std::string reason) {
    if (why_not) *why_not = std::move(reason);
    return false;
  };

  // Round 1: where each rank runs. Round 2: whether each rank can reach every other's device. Both
  // rounds complete on every rank before any decision, so all ranks decide alike and none hangs.
  char bus_id[32] = {};
  const bool on_gpu = device >= 0 && cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) == cudaSuccess;
  store.set(key + "where/" + std::to_string(rank), on_gpu ? host_identity() + "|" + bus_id : "no device");
  std::string problem;
  if (world < 2 || world > kMaxPeerRanks) problem = fmt::format("{} ranks (copy engines: 2 to {})", world, kMaxPeerRanks);
  const std::string mine = host_identity();
  for (int r = 0; r < world; ++r) {
    std::string where = store.get(key + "where/" + std::to_string(r));
    if (!problem.empty() || r == rank) continue;
    size_t bar = where.find('|');
    if (bar == std::string::npos || !on_gpu) {
      problem = fmt::format("rank {} has no CUDA device", on_gpu ? r : rank);
    } else if (where.substr(0, bar) != mine) {
      problem = fmt::format("rank {} runs on another host", r);
    } else {
      int peer = -1, access = 0;
      if (cudaDeviceGetByPCIBusId(&peer, where.substr(bar + 1).c_str()) != cudaSuccess) {
        (void)cudaGetLastError();
        problem = fmt::format("rank {}'s GPU {} is not visible to rank {}", r, where.substr(bar + 1), rank);
      } else if (cudaDeviceCanAccessPeer(&access, device, peer) != cudaSuccess || !access) {
        (void)cudaGetLastError();
        problem = fmt::format("GPU {} of rank {} has no peer access to GPU {} of rank {}", device, rank, peer, r);
      }
    }
  }
  store.set(key + "verdict/" + std::to_string(rank), problem);
  for (int r = 0; r < world; ++r) {
    std::string theirs = store.get(key + "verdict/" + std::to_string(r));
    if (problem.empty() && !theirs.empty()) problem = theirs;
  }
  if (!problem.empty()) return fail(problem);
  return true;
}

struct PeerExchange::Impl {
  std::shared_ptr<ProcessGroup> group;
  int rank = 0, world = 0, device = 0;
  std::vector<ExchangeBucket> buckets;
  std::vector<size_t> buffer_at, recv_at, slot_bytes;  // byte offsets in a block; bytes of a receive slot
  std::shared_ptr<OwnedBlock> block;
  std::vector<char*> peer;  // every rank's block as this process maps it ([rank] is ours)
  cudaStream_t stream = nullptr;
  uint32_t seq = 0;
  // DPT_PEER_SIGNAL=copy: write a flag into a peer's block by copying it from our outbox instead of a
  // driver write straight into peer memory (a fallback, should a platform refuse the latter).
  bool signal_by_copy = false;

  size_t esize(size_t b) const { return dtype_size(buckets[b].dtype); }
  int64_t begin(size_t b, int c) const { return chunk_begin(buckets[b].numel, world, c); }
  // Where rank `from`'s copy of chunk `to` lands in rank `to`'s receive area of bucket b.
  char* slot(size_t b, int from, int to) const {
    return peer[to] + recv_at[b] + static_cast<size_t>(from < to ? from : from - 1) * slot_bytes[b];
  }
  // Word `index` of flag row `row` in rank `on`'s block: row 0 arrived, 1 done, 2 and 3 our outbox.
  char* word(int on, int row, int index) const {
    return peer[on] + static_cast<size_t>(row * kMaxPeerRanks + index) * sizeof(uint32_t);
  }
  CUdeviceptr flag(int on, bool done, int from) const { return reinterpret_cast<CUdeviceptr>(word(on, done, from)); }
  // Tells rank `on` that step 1 (arrived) or 3 (done) of the current sequence number has landed there.
  // Stream order puts the write after our copies into that block have completed.
  void signal(int on, bool done) const {
    if (!signal_by_copy) {
      check_driver(stream_mem_ops().write(stream, flag(on, done, rank), seq, CU_STREAM_WRITE_VALUE_DEFAULT),
                   "cuStreamWriteValue32");
      return;
    }
    char* outbox = word(rank, 2 + done, on);
    check_driver(stream_mem_ops().write(stream, reinterpret_cast<CUdeviceptr>(outbox), seq,
                                        CU_STREAM_WRITE_VALUE_DEFAULT),
                 "cuStreamWriteValue32");
    DPT_CUDA_CHECK(cudaMemcpyAsync(word(on, done, rank), outbox, sizeof(uint32_t), cudaMemcpyDefault, stream));
  }
  void wait_all(bool done) const {
    for (int q = 0; q < world; ++q) {
      if (q == rank) continue;
      check_driver(stream_mem_ops().wait(stream, flag(rank, done, q), seq, CU_STREAM_WAIT_VALUE_GEQ),
                   "cuStreamWaitValue32");
    }
  }
};

PeerExchange::PeerExchange(std::shared_ptr<ProcessGroup> group, const std::vector<ExchangeBucket>& buckets, int device,
                           const std::string& key)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.group = std::move(group);
  I.rank = I.group->rank();
  I.world = I.group->size();
  I.device = device;
  I.buckets = buckets;
  DPT_CHECK(I.world >= 2 && I.world <= kMaxPeerRanks, "PeerExchange: {} ranks (2 to {} supported)", I.world,
            kMaxPeerRanks);
  (void)stream_mem_ops();
  const char* signal_env = std::getenv("DPT_PEER_SIGNAL");
  I.signal_by_copy = signal_env != nullptr && std::string(signal_env) == "copy";

  // Layout (the same on every rank): flags, then per bucket its buffer and world - 1 receive slots.
  size_t at = kFlagBytes;
  for (size_t b = 0; b < buckets.size(); ++b) {
    DPT_CHECK(buckets[b].dtype == DType::Float32 || buckets[b].dtype == DType::BFloat16 ||
                  buckets[b].dtype == DType::Float16,
              "PeerExchange: bucket {} has dtype {} (float32, bfloat16 or float16 only)", b,
              dtype_name(buckets[b].dtype));
    int64_t widest = 0;
    for (int c = 0; c < I.world; ++c) widest = std::max(widest, I.begin(b, c + 1) - I.begin(b, c));
    I.buffer_at.push_back(at);
    at = round_up(at + static_cast<size_t>(buckets[b].numel) * I.esize(b), kAlignBytes);
    I.recv_at.push_back(at);
    I.slot_bytes.push_back(round_up(static_cast<size_t>(widest) * I.esize(b), kAlignBytes));
    at += I.slot_bytes.back() * static_cast<size_t>(I.world - 1);
  }

  cuda::DeviceGuard guard(device);
  I.block = std::make_shared<OwnedBlock>();
  I.block->device = device;
  DPT_CUDA_CHECK(cudaMalloc(&I.block->ptr, at));
  int least = 0, greatest = 0;
  DPT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  I.stream = cuda::create_stream(device, greatest);
  // Flags start below every sequence number; buffers at zero. The fill must have *finished* before any
  // peer can see the block (the barrier below): a peer's first flag write landing before a late fill
  // would be wiped out, and we would wait for it forever. Our streams do not order against the legacy
  // default stream a plain cudaMemset uses, hence the fill on our stream and the host wait.
  DPT_CUDA_CHECK(cudaMemsetAsync(I.block->ptr, 0, at, I.stream));
  DPT_CUDA_CHECK(cudaStreamSynchronize(I.stream));
  cudaIpcMemHandle_t handle;
  DPT_CUDA_CHECK(cudaIpcGetMemHandle(&handle, I.block->ptr));

  Store& store = *I.group->store();
  const std::string base = next_call_key(store, I.rank, "blocks") + key + "/";
  store.set(base + std::to_string(I.rank), std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
  I.peer.assign(I.world, nullptr);
  I.peer[I.rank] = I.block->ptr;
  for (int r = 0; r < I.world; ++r) {
    if (r == I.rank) continue;
    std::string theirs = store.get(base + std::to_string(r));
    DPT_CHECK(theirs.size() == sizeof(cudaIpcMemHandle_t), "PeerExchange: rank {} published a malformed handle", r);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, theirs.data(), sizeof(h));
    void* mapped = nullptr;
    DPT_CUDA_CHECK(cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess));
    I.peer[r] = static_cast<char*>(mapped);
  }
  // Nobody writes into a peer's block before that peer has zeroed it (above) and mapped everyone's.
  store.barrier(base + "mapped");
}

PeerExchange::~PeerExchange() {
  Impl& I = *impl_;
  cuda::DeviceGuard guard(I.device);
  if (I.stream) cudaStreamSynchronize(I.stream);  // our copies into peers' blocks have landed
  for (int r = 0; r < I.world; ++r) {
    if (r != I.rank && I.peer[r]) cudaIpcCloseMemHandle(I.peer[r]);
  }
  cuda::destroy_stream(I.stream);
}

Tensor PeerExchange::buffer(size_t b) const {
  const Impl& I = *impl_;
  DPT_CHECK(b < I.buckets.size(), "PeerExchange::buffer: bucket {} of {}", b, I.buckets.size());
  std::shared_ptr<OwnedBlock> owner = I.block;
  return from_blob(I.block->ptr + I.buffer_at[b], {I.buckets[b].numel},
                   TensorOptions{}.with_dtype(I.buckets[b].dtype).with_device(Device::cuda(I.device)),
                   [owner](void*) {});
}

std::shared_ptr<Work> PeerExchange::average(size_t b) {
  Impl& I = *impl_;
  DPT_CHECK(b < I.buckets.size(), "PeerExchange::average: bucket {} of {}", b, I.buckets.size());
  cuda::DeviceGuard guard(I.device);
  ++I.seq;
  cuda::CudaEvent ready(false, I.device);
  ready.record(cuda::current_stream(I.device));
  ready.wait(I.stream);

  const size_t es = I.esize(b);
  char* own = I.peer[I.rank] + I.buffer_at[b];
  auto bytes_of = [&](int c) { return static_cast<size_t>(I.begin(b, c + 1) - I.begin(b, c)) * es; };
  auto chunk = [&](char* buffer, int c) { return buffer + static_cast<size_t>(I.begin(b, c)) * es; };

  // 1. Scatter: peer p's chunk of our gradients into its receive area.
  for (int p = 0; p < I.world; ++p) {
    if (p == I.rank || bytes_of(p) == 0) continue;
    DPT_CUDA_CHECK(cudaMemcpyAsync(I.slot(b, I.rank, p), chunk(own, p), bytes_of(p), cudaMemcpyDefault, I.stream));
  }
  for (int p = 0; p < I.world; ++p) {
    if (p != I.rank) I.signal(p, false);
  }
  // 2. Reduce our chunk once every peer's copy of it has arrived; ranks summed in rank order.
  I.wait_all(false);
  std::vector<const void*> inputs;
  for (int r = 0; r < I.world; ++r) inputs.push_back(r == I.rank ? chunk(own, I.rank) : I.slot(b, r, I.rank));
  peer_average(chunk(own, I.rank), inputs, I.begin(b, I.rank + 1) - I.begin(b, I.rank), I.buckets[b].dtype, I.stream);
  // 3. Gather: our averaged chunk into every peer's buffer.
  for (int p = 0; p < I.world; ++p) {
    if (p == I.rank || bytes_of(I.rank) == 0) continue;
    DPT_CUDA_CHECK(cudaMemcpyAsync(chunk(I.peer[p] + I.buffer_at[b], I.rank), chunk(own, I.rank), bytes_of(I.rank),
                                   cudaMemcpyDefault, I.stream));
  }
  for (int p = 0; p < I.world; ++p) {
    if (p != I.rank) I.signal(p, true);
  }
  // 4. Every peer's averaged chunk has landed in our buffer.
  I.wait_all(true);
  cuda::CudaEvent end(false, I.device);
  end.record(I.stream);
  return std::make_shared<ExchangeWork>(
      std::move(end), I.device,
      fmt::format("copy-engine average #{} (bucket {}, {} x {})", I.seq, b, I.buckets[b].numel,
                  dtype_name(I.buckets[b].dtype)));
}

#endif  // DPT_HAVE_CUDA

}  // namespace dpt::dist
