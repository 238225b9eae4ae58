#pragma once
// Backend: what a collective library (Gloo, NCCL) must provide to a ProcessGroup. Arguments arrive
// already validated by ProcessGroup (defined, contiguous, same device and dtype, sizes that agree), so
// backends only move bytes. Ranks are ranks within the group.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/work.h"
#include "core/tensor.h"
#include "rendezvous/store.h"

namespace dpt::dist {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

// What an operation is, for error messages and the debug-mode agreement check.
struct OpDesc {
  uint64_t seq = 0;         // position in the group's sequence of operations, from 1
  std::string name;         // "allreduce", "broadcast", ...
  std::string description;  // "allreduce #12 (sum, 1024 x float32)"
  // NCCL: run on the caller's current stream instead of the communication stream (ProcessGroup's
  // async_op = false). Other backends ignore it.
  bool on_caller_stream = false;
};

struct BackendOptions {
  Milliseconds timeout{std::chrono::minutes(10)};  // per operation
  // Communicator setup is a rendezvous: bounded by the longer of this and `timeout`, so a short
  // operation timeout does not fail a setup slowed by a busy machine.
  Milliseconds setup_timeout{0};
  int device = -1;                                  // CUDA device (NCCL); -1: the current device
  std::string local_host;                           // Gloo: address to listen on (reachable by peers)
  bool copy_engines = false;                        // NCCL: ProcessGroupOptions::copy_engines
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // In place. Several tensors: one group call (coalesced); they may differ in size and dtype.
  virtual std::shared_ptr<Work> allreduce(const std::vector<Tensor>& tensors, ReduceOp op, const OpDesc& desc) = 0;
  virtual std::shared_ptr<Work> broadcast(const Tensor& tensor, int root, const OpDesc& desc) = 0;
  // output holds size() blocks of input's numel, block r from rank r.
  virtual std::shared_ptr<Work> allgather(const Tensor& output, const Tensor& input, const OpDesc& desc) = 0;
  // input holds size() blocks of output's numel; rank r receives the reduction of block r.
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                               const OpDesc& desc) = 0;
  virtual std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag, const OpDesc& desc) = 0;
  virtual std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag, const OpDesc& desc) = 0;
  virtual std::shared_ptr<Work> barrier(const OpDesc& desc) = 0;
  // input and output hold size() blocks each; block r of input goes to rank r, output block r comes from rank r.
  virtual std::shared_ptr<Work> alltoall(const Tensor& output, const Tensor& input, const OpDesc& desc);
  // Zeroed flat memory that this backend's communicator can reach on every rank (ProcessGroup::symmetric_zeros).
  virtual Tensor symmetric_zeros(int64_t numel, const TensorOptions& options);
  virtual void register_symmetric(const Tensor& tensor);
};

// Gloo over TCP for CPU tensors. Connects the full mesh through `store` (collective over the group).
std::shared_ptr<Backend> make_gloo_backend(std::shared_ptr<Store> store, int rank, int size,
                                           const BackendOptions& options);
// NCCL for CUDA tensors; throws in a build without CUDA. Collective over the group.
std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Store> store, int rank, int size,
                                           const BackendOptions& options);

}  // namespace dpt::dist
