#pragma once
// ProcessGroup: the collectives that data-parallel training is built from, over one set of ranks.
//
// One interface, two backends chosen by the tensors' device (or forced by options.backend): Gloo for
// CPU tensors, NCCL for CUDA tensors. Every call is asynchronous and returns a Work (see work.h).
// Every rank of the group must issue the same collectives in the same order; with
// DPT_DEBUG_COLLECTIVES=1 (or options.debug_collectives) each collective first checks through the store
// that all ranks agree on (sequence number, op, element count, dtype) and throws naming the first rank
// that differs, instead of hanging.
//
// Tensors must be contiguous. Reductions run in place. Integer tensors support sum/max/min (not avg).
//
// async_op (as in torch.distributed): true (the default here) runs a CUDA collective on the group's
// communication stream, ordered after the caller's stream by an event, so the caller's stream keeps
// computing until it calls wait() — what overlapping communication with compute needs. false runs it on
// the caller's current stream itself, which is what a collective waited for at once wants: work queued
// after it on that stream is ordered after it with no event hop between streams in either direction
// (a few microseconds each on the GPU), and wait() costs nothing. The result is the same either way.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/backend.h"
#include "collectives/work.h"
#include "core/tensor.h"
#include "rendezvous/env.h"
#include "rendezvous/store.h"

namespace dpt::dist {

inline constexpr Milliseconds kDefaultCollectiveTimeout{std::chrono::minutes(10)};

struct ProcessGroupOptions {
  std::string backend = "auto";  // "auto" (by tensor device), "gloo" or "nccl"
  Milliseconds timeout = kDefaultCollectiveTimeout;  // per collective; NCCL's watchdog aborts after it
  Milliseconds store_timeout = kDefaultStoreTimeout; // rendezvous and debug-mode checks
  bool debug_collectives = false;  // also turned on by the environment variable DPT_DEBUG_COLLECTIVES=1
  int cuda_device = -1;            // device of the NCCL communicator; -1: the current device
  // NCCL 2.28+: the communicator's zero-CTA policy. All-gathers and all-to-alls between symmetric tensors
  // (symmetric_zeros) of the GPUs of one host then move their bytes with the copy engines, with no kernel
  // on the SMs; other operations are unchanged. No effect on Gloo.
  bool copy_engines = false;
};

class ProcessGroup {
 public:
  // `store` is this group's namespace (a PrefixStore); rank and size are within the group.
  ProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options = {},
               std::string local_host = "");
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ProcessGroupOptions& options() const { return options_; }
  const std::shared_ptr<Store>& store() const { return store_; }

  std::shared_ptr<Work> allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum, bool async_op = true);
  // Many tensors (any sizes, one device, possibly mixed dtypes) reduced in one group call.
  std::shared_ptr<Work> allreduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::Sum);
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root, bool async_op = true);
  // output.numel() == size() * input.numel(); output block r is rank r's input.
  std::shared_ptr<Work> allgather(const Tensor& output, const Tensor& input, bool async_op = true);
  // input.numel() == size() * output.numel(); output = reduction over ranks of input block rank().
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum,
                                       bool async_op = true);
  // Point-to-point. Gloo posts both at once, in any order. NCCL runs them in issue order on the
  // communication stream (the tag is unused), so two peers must not both send first (as with
  // blocking MPI): let one side receive first.
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0);
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0);
  // On the CPU backend unless options.backend is "nccl"; wait() blocks the host either way.
  std::shared_ptr<Work> barrier();
  // NCCL only. input and output hold size() equal blocks: input block r goes to rank r, and output block r
  // is rank r's input block rank().
  std::shared_ptr<Work> alltoall(const Tensor& output, const Tensor& input, bool async_op = true);

  // A zeroed flat tensor that NCCL can address on every rank of this group: allocated by ncclMemAlloc and
  // registered as a symmetric window of this group's communicator (the same offsets must be used on every
  // rank). What copy-engine collectives (ProcessGroupOptions::copy_engines) and NCCL's symmetric kernels
  // need. Collective. CPU tensors, or NCCL older than 2.28: plain zeros.
  Tensor symmetric_zeros(int64_t numel, const TensorOptions& options);
  // Registers a tensor from another group's symmetric_zeros with this group's communicator too. Collective.
  void register_symmetric(const Tensor& tensor);

  // A group of a subset of this group's ranks (given as ranks of this group). Collective: every rank
  // of this group must call it, with the same list; ranks outside the list get nullptr.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks);
  // The same with other options (for example copy_engines) than this group's.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, ProcessGroupOptions options);
  // A group of every rank of this one on a communicator of its own (operations on the two do not queue
  // behind each other), with this group's options or others. Collective.
  std::shared_ptr<ProcessGroup> duplicate() { return duplicate(options_); }
  std::shared_ptr<ProcessGroup> duplicate(ProcessGroupOptions options);

  // The backend that serves tensors on `device` ("gloo" or "nccl"), creating it on first use.
  std::string backend_name(Device device);

 private:
  Backend& backend_for(Device device);
  OpDesc next_op(const std::string& name, const std::string& detail, bool async_op = true);
  // Debug mode: all ranks publish (seq, op, count, dtype) and compare before the collective runs.
  void check_agreement(const OpDesc& desc, const std::string& fingerprint);

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  ProcessGroupOptions options_;
  std::string local_host_;

  std::mutex mutex_;  // guards backend creation and the counters
  std::shared_ptr<Backend> gloo_;
  std::shared_ptr<Backend> nccl_;
  uint64_t seq_ = 0;
  uint64_t groups_created_ = 0;
};

// The world: reads the launch environment (env.h), lets rank 0 host the TCP store at
// MASTER_ADDR:MASTER_PORT, and namespaces keys by the restart attempt (DPT_RESTART_COUNT).
std::shared_ptr<ProcessGroup> init_process_group(ProcessGroupOptions options = {});
std::shared_ptr<ProcessGroup> init_process_group(const DistEnv& env, ProcessGroupOptions options = {});

}  // namespace dpt::dist
