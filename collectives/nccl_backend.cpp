// NCCL backend: CUDA tensors. Compiled in every build (the folder glob picks it up); the real code is
// only there with CUDA, a CPU build gets a factory that explains.
//
// Stream ordering. Each backend owns a communication stream (highest priority, so its kernels are
// scheduled as soon as they can run alongside compute). A call records an event on the caller's current
// stream and makes the comm stream wait on it, so the collective sees everything the caller queued
// before; it then enqueues the NCCL call on the comm stream and records an end event there.
// Work::wait() makes the caller's *current* stream wait on the end event: no host synchronisation.
//
// Memory. The tensors of an operation are kept alive by its entry in the watchdog's pending list until
// the end event has completed, so the stream-ordered allocator never hands their memory to other work
// while NCCL still reads or writes it.
//
// Failure. NCCL has no timeout of its own and a dead peer over NVLink can leave kernels spinning forever.
// Communicators are non-blocking; a watchdog thread polls every pending operation's end event and, between
// launches, ncclCommGetAsyncError every 100 ms. Past the timeout, or on an asynchronous error, it aborts the
// communicator (ncclCommAbort, which makes the spinning kernels exit), after which every pending and
// later call fails with an error naming the operation, its sequence number and the timeout. If the
// abort itself hangs, or no thread of the program notices the error within kUnobservedErrorGrace, the
// process exits with status 1 after printing the error, so a job never hangs silently.
//
// CUDA graphs. A collective enqueued while the caller's stream is being captured becomes a node of the
// graph (the comm stream joins the capture through the event it waits on, and leaves it when the caller
// waits on the end event). Nothing runs then, so such an operation is not handed to the watchdog, and
// its Work can be waited on by streams but not asked about from the host. Each replay runs the captured
// collectives again; the watchdog cannot see those (NCCL's own ncclCommAbort still stops them if
// another operation fails), so a graph is replayed only by a program whose ranks replay in step.
#include "collectives/backend.h"

#ifndef DPT_HAVE_CUDA

namespace dpt::dist {

std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Store>, int, int, const BackendOptions&) {
  DPT_FAIL("the NCCL backend is not available: this build has no CUDA (use CPU tensors with the Gloo backend)");
}

}  // namespace dpt::dist

#else  // DPT_HAVE_CUDA

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "collectives/nccl_check.h"
#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "core/cuda_runtime.h"
#include "core/factory.h"
#include "core/flags.h"

namespace dpt::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);
constexpr auto kAbortDeadline = std::chrono::seconds(60);
constexpr auto kUnobservedErrorGrace = std::chrono::seconds(15);

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
  }
  DPT_FAIL("NCCL: unsupported dtype {}", dtype_name(dtype));
}

// NCCL 2.28 brought symmetric windows with the zero-CTA policy that routes all-gathers and all-to-alls
// between windows to the copy engines. Older NCCL: plain memory and kernels.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define DPT_NCCL_HAS_COPY_ENGINES 1
#else
#define DPT_NCCL_HAS_COPY_ENGINES 0
#endif

// Memory from ncclMemAlloc (physical memory NCCL can map into its peers' address space), freed when the
// last tensor viewing it goes. A communicator that registered it keeps its own reference to the physical
// pages until it deregisters, so the order of the two releases does not matter.
struct SymmetricBlock {
  void* ptr = nullptr;
  int device = 0;
  ~SymmetricBlock() {
#if DPT_NCCL_HAS_COPY_ENGINES
    cuda::DeviceGuard guard(device);
    ncclMemFree(ptr);
#endif
  }
};

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// Shared between the backend, its works and its watchdog: the communicator's health.
struct CommState {
  std::mutex mutex;
  std::string error;                  // first failure; empty while healthy
  std::atomic<bool> observed{false};  // some thread has thrown the error to the program
  std::atomic<uint64_t> last_completed{0};

  std::string get_error() {
    std::lock_guard<std::mutex> lock(mutex);
    return error;
  }
  bool set_error(const std::string& e) {  // true for the first error
    std::lock_guard<std::mutex> lock(mutex);
    if (!error.empty()) return false;
    error = e;
    return true;
  }
  [[noreturn]] void raise(const std::string& context) {
    observed = true;
    DPT_FAIL("{}: {}", context, get_error());
  }
};

class NcclWork : public Work {
 public:
  NcclWork(OpDesc desc, int device, std::shared_ptr<CommState> state, bool host_blocking, cudaStream_t stream,
           bool captured)
      : desc_(std::move(desc)), device_(device), state_(std::move(state)), host_blocking_(host_blocking),
        captured_(captured), stream_(stream), end_(false, device) {}

  void wait() override {
    if (!state_->get_error().empty()) state_->raise("NCCL " + desc_.description + " did not complete");
    if (host_blocking_) {
      synchronize();
      return;
    }
    cuda::DeviceGuard guard(device_);
    cudaStream_t current = cuda::current_stream(device_);
    if (current != stream_) end_.wait(current);  // on its own stream, later work is ordered after it already
  }

  bool is_completed() override {
    refuse_if_captured("is_completed()");
    return !state_->get_error().empty() || end_.query();
  }

  // Host wait that keeps checking for the watchdog's verdict instead of blocking in the driver.
  void synchronize() override {
    refuse_if_captured("synchronize()");
    while (true) {
      if (!state_->get_error().empty()) state_->raise("NCCL " + desc_.description + " did not complete");
      if (end_.query()) break;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    cuda::DeviceGuard guard(device_);
    end_.wait(cuda::current_stream(device_));
  }

  std::string describe() const override { return desc_.description; }

  cuda::CudaEvent& end_event() { return end_; }
  const OpDesc& desc() const { return desc_; }

 private:
  // Its end event marks a node of a graph, not work that will ever finish on a stream.
  void refuse_if_captured(const char* what) const {
    DPT_CHECK(!captured_, "NCCL {}: {} of an operation captured in a CUDA graph; the graph's replays run it, "
              "so wait for it on a stream (wait()) or synchronise after a replay", desc_.description, what);
  }

  OpDesc desc_;
  int device_;
  std::shared_ptr<CommState> state_;
  bool host_blocking_;
  bool captured_;
  cudaStream_t stream_;  // where the operation was queued
  cuda::CudaEvent end_;
};

class NcclBackend : public Backend {
 public:
  NcclBackend(std::shared_ptr<Store> store, int rank, int size, const BackendOptions& options)
      : rank_(rank),
        size_(size),
        timeout_(options.timeout),
        setup_timeout_(std::max(options.timeout, options.setup_timeout)),
        state_(std::make_shared<CommState>()) {
    // NVLink SHARP needs multicast support that shared machines often lack; opt in explicitly.
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    device_ = options.device >= 0 ? options.device : cuda::current_device();
    cuda::DeviceGuard guard(device_);

    ncclUniqueId id;
    if (rank_ == 0) {
      DPT_NCCL_CHECK(ncclGetUniqueId(&id));
      store->set("unique_id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      std::string bytes = store->get("unique_id");
      DPT_CHECK(bytes.size() == sizeof(id), "NCCL unique id from {} has {} bytes, expected {}", store->describe(),
                bytes.size(), sizeof(id));
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    // Setup is non-blocking: a peer that never joins costs a clear error after the timeout, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    DPT_NCCL_CHECK(ncclCommInitRankConfig(&setup_comm_, size_, id, rank_, &config));
    comm_ = setup_comm_;  // for wait_ready
    try {
      wait_ready(Clock::now() + setup_timeout_,
                 fmt::format("communicator setup of rank {} of {} on cuda:{}", rank_, size_, device_), setup_timeout_);
    } catch (...) {
      ncclCommAbort(setup_comm_);
      throw;
    }
    // Operations go through a blocking child of that communicator. On a non-blocking communicator NCCL
    // launches every group from a newly created thread (and returns ncclInProgress), which costs tens of
    // microseconds per collective; a blocking one enqueues on the caller's thread. Failures after setup
    // are the watchdog's business, and ncclCommAbort works on blocking communicators as well.
    ncclConfig_t op_config = NCCL_CONFIG_INITIALIZER;
    op_config.blocking = 1;
#if DPT_NCCL_HAS_COPY_ENGINES
    if (options.copy_engines) op_config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
#endif
    ncclComm_t op_comm = nullptr;
    ncclResult_t split = ncclCommSplit(setup_comm_, 0, rank_, &op_comm, &op_config);
    if (split != ncclSuccess && split != ncclInProgress) {
      ncclCommAbort(setup_comm_);
      fail_nccl(split, setup_comm_, "ncclCommSplit", __FILE__, __LINE__);
    }
    // The split of a non-blocking parent runs on an NCCL thread, which fills in op_comm when it has
    // created the child; until then only the parent can be asked how it goes.
    auto split_deadline = Clock::now() + setup_timeout_;
    while (std::atomic_ref<ncclComm_t>(op_comm).load(std::memory_order_acquire) == nullptr) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(setup_comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(setup_comm_);
        fail_nccl(async, setup_comm_, "ncclCommSplit (asynchronous part)", __FILE__, __LINE__);
      }
      if (Clock::now() >= split_deadline) {
        ncclCommAbort(setup_comm_);
        DPT_FAIL("NCCL communicator split of rank {} of {} did not complete within {} ms", rank_, size_,
                 setup_timeout_.count());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    comm_ = op_comm;
    try {
      wait_ready(split_deadline, fmt::format("communicator split of rank {} of {}", rank_, size_), setup_timeout_);
    } catch (...) {
      ncclCommAbort(comm_);
      ncclCommAbort(setup_comm_);
      throw;
    }
    // High priority: the block scheduler starts a collective's blocks ahead of queued compute blocks, so
    // communication launched during backward starts at once. DPT_COMM_STREAM_PRIORITY=normal gives it
    // the compute streams' priority (for measuring how the two share the SMs; core/flags.h).
    int least = 0, greatest = 0;
    DPT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    const bool normal = flag_value(Flag::CommStreamPriority) == "normal";
    comm_stream_ = cuda::create_stream(device_, normal ? least : greatest);
    ready_ = std::make_unique<cuda::CudaEvent>(false, device_);
    watchdog_ = std::thread([this] { watchdog_loop(); });
  }

  ~NcclBackend() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    watchdog_cv_.notify_all();
    watchdog_.join();
    if (!aborted_) {
      // Healthy: let the last operations finish (bounded), then release the communicator. (The watchdog has
      // stopped: nothing records an error meanwhile.)
      if (state_->get_error().empty() && drain_pending(Clock::now() + timeout_)) {
#if DPT_NCCL_HAS_COPY_ENGINES
        for (ncclWindow_t w : windows_) ncclCommWindowDeregister(comm_, w);
#endif
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    ncclCommAbort(setup_comm_);  // idle since the split; abort releases it without waiting on peers
    pending_.clear();
    finished_.clear();
    ready_.reset();
    cuda::destroy_stream(comm_stream_);
  }

  const char* name() const override { return "nccl"; }

  std::shared_ptr<Work> allreduce(const std::vector<Tensor>& tensors, ReduceOp op, const OpDesc& desc) override {
    return launch(desc, tensors, false, [&](cudaStream_t s) {
      for (const auto& t : tensors) {
        DPT_NCCL_CHECK_COMM(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                          nccl_dtype(t.dtype()), nccl_op(op), comm_, s),
                            comm_);
      }
    });
  }

  std::shared_ptr<Work> broadcast(const Tensor& t, int root, const OpDesc& desc) override {
    return launch(desc, {t}, false, [&](cudaStream_t s) {
      DPT_NCCL_CHECK_COMM(ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                        nccl_dtype(t.dtype()), root, comm_, s),
                          comm_);
    });
  }

  std::shared_ptr<Work> allgather(const Tensor& output, const Tensor& input, const OpDesc& desc) override {
    return launch(desc, {output, input}, false, [&](cudaStream_t s) {
      DPT_NCCL_CHECK_COMM(ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                                        nccl_dtype(input.dtype()), comm_, s),
                          comm_);
    });
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                       const OpDesc& desc) override {
    return launch(desc, {output, input}, false, [&](cudaStream_t s) {
      DPT_NCCL_CHECK_COMM(ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                                            nccl_dtype(input.dtype()), nccl_op(op), comm_, s),
                          comm_);
    });
  }

  // NCCL matches point-to-point messages in issue order per peer; the tag is not used.
  std::shared_ptr<Work> send(const Tensor& t, int dst, int, const OpDesc& desc) override {
    return launch(desc, {t}, false, [&](cudaStream_t s) {
      DPT_NCCL_CHECK_COMM(ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_dtype(t.dtype()), dst, comm_, s),
                          comm_);
    });
  }

  std::shared_ptr<Work> recv(const Tensor& t, int src, int, const OpDesc& desc) override {
    return launch(desc, {t}, false, [&](cudaStream_t s) {
      DPT_NCCL_CHECK_COMM(ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_dtype(t.dtype()), src, comm_, s),
                          comm_);
    });
  }

  std::shared_ptr<Work> alltoall(const Tensor& output, const Tensor& input, const OpDesc& desc) override {
    const size_t block = static_cast<size_t>(input.numel() / size_);
    return launch(desc, {output, input}, false, [&](cudaStream_t s) {
#if DPT_NCCL_HAS_COPY_ENGINES
      DPT_NCCL_CHECK_COMM(ncclAlltoAll(input.data_ptr(), output.data_ptr(), block, nccl_dtype(input.dtype()), comm_, s),
                          comm_);
#else
      const size_t bytes = block * dtype_size(input.dtype());
      for (int r = 0; r < size_; ++r) {
        DPT_NCCL_CHECK_COMM(ncclSend(static_cast<const char*>(input.data_ptr()) + r * bytes, block,
                                     nccl_dtype(input.dtype()), r, comm_, s), comm_);
        DPT_NCCL_CHECK_COMM(ncclRecv(static_cast<char*>(output.data_ptr()) + r * bytes, block,
                                     nccl_dtype(input.dtype()), r, comm_, s), comm_);
      }
#endif
    });
  }

  Tensor symmetric_zeros(int64_t numel, const TensorOptions& options) override {
#if DPT_NCCL_HAS_COPY_ENGINES
    DPT_CHECK(options.device.is_cuda() && options.device.index == device_,
              "symmetric_zeros: this communicator serves cuda:{}, asked for {}", device_, options.device.str());
    cuda::DeviceGuard guard(device_);
    const size_t bytes = static_cast<size_t>(numel) * dtype_size(options.dtype);
    auto block = std::make_shared<SymmetricBlock>();
    block->device = device_;
    DPT_NCCL_CHECK(ncclMemAlloc(&block->ptr, bytes));
    // Zeroed and finished before any peer can map it (a late fill would wipe what a peer wrote).
    DPT_CUDA_CHECK(cudaMemsetAsync(block->ptr, 0, bytes, comm_stream_));
    DPT_CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
    Tensor t = from_blob(block->ptr, {numel}, options, [block](void*) {});
    register_symmetric(t);
    return t;
#else
    return Backend::symmetric_zeros(numel, options);
#endif
  }

  void register_symmetric(const Tensor& tensor) override {
#if DPT_NCCL_HAS_COPY_ENGINES
    cuda::DeviceGuard guard(device_);
    std::lock_guard<std::mutex> lock(launch_mutex_);  // no NCCL call beside the watchdog's (launch_mutex_)
    ncclWindow_t window = nullptr;
    const size_t bytes = static_cast<size_t>(tensor.numel()) * dtype_size(tensor.dtype());
    ncclResult_t result = ncclCommWindowRegister(comm_, tensor.data_ptr(), bytes, &window, NCCL_WIN_COLL_SYMMETRIC);
    DPT_CHECK(result == ncclSuccess, "register_symmetric: NCCL could not register {} bytes at {} as a symmetric "
              "window ({}); the tensor must come from ProcessGroup::symmetric_zeros", bytes, tensor.data_ptr(),
              ncclGetErrorString(result));
    // Without symmetric support (GPUs without peer access, several hosts) NCCL registers nothing.
    if (window != nullptr) windows_.push_back(window);
#else
    (void)tensor;
#endif
  }

  // An allreduce of one element; its Work blocks the host in wait(), as a barrier should.
  std::shared_ptr<Work> barrier(const OpDesc& desc) override {
    Tensor token = Tensor::empty({1}, TensorOptions{}.with_dtype(DType::Int32).with_device(Device::cuda(device_)));
    return launch(desc, {token}, true, [&](cudaStream_t s) {
      DPT_NCCL_CHECK_COMM(ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclInt32, ncclSum, comm_, s), comm_);
    });
  }

 private:
  struct Pending {
    std::shared_ptr<NcclWork> work;
    std::vector<Tensor> keep_alive;
    Clock::time_point start;
  };

  // Non-blocking communicators: after a call that may return ncclInProgress, poll until the
  // communicator is ready again, bounded by `deadline`.
  void wait_ready(Clock::time_point deadline, const std::string& what, Milliseconds limit) {
    while (true) {
      ncclResult_t async = ncclSuccess;
      DPT_NCCL_CHECK_COMM(ncclCommGetAsyncError(comm_, &async), comm_);
      if (async == ncclSuccess) return;
      if (async != ncclInProgress) fail_nccl(async, comm_, what.c_str(), __FILE__, __LINE__);
      if (Clock::now() >= deadline) {
        DPT_FAIL("NCCL {} did not complete within the timeout of {} ms (a peer never joined or is stuck)", what,
                 limit.count());
      }
      // Usually only the first calls (connection setup) are in progress; yield rather than sleep so a
      // small collective does not pay a scheduler tick of latency.
      std::this_thread::yield();
    }
  }

  template <class Enqueue>
  std::shared_ptr<Work> launch(const OpDesc& desc, std::vector<Tensor> tensors, bool host_blocking,
                               Enqueue&& enqueue) {
    if (!state_->get_error().empty()) state_->raise("NCCL " + desc.description + " refused");
    for (const auto& t : tensors) {
      DPT_CHECK(t.device().is_cuda() && t.device().index == device_,
                "NCCL {}: tensors must be on cuda:{} (this communicator's device), found {}", desc.description,
                device_, t.device().str());
    }
    cuda::DeviceGuard guard(device_);
    cudaStream_t caller = cuda::current_stream(device_);
    const cudaStream_t stream = desc.on_caller_stream ? caller : comm_stream_;
    const bool captured = cuda::stream_is_capturing(caller);
    DPT_CHECK(!captured || !host_blocking, "NCCL {}: cannot be captured in a CUDA graph (it blocks the host until "
              "every rank arrives)", desc.description);
    auto work = std::make_shared<NcclWork>(desc, device_, state_, host_blocking, stream, captured);
    {
      std::lock_guard<std::mutex> lock(launch_mutex_);
      if (desc.on_caller_stream) {
        // Operations of one communicator run one at a time in issue order: if asynchronous ones are
        // still queued on the comm stream, the caller's stream first waits for the last of them.
        if (comm_stream_used_) {
          ready_->record(comm_stream_);
          ready_->wait(caller);
          comm_stream_used_ = false;
        }
      } else {
        // The comm stream starts after everything the caller queued so far (the tensors' producers).
        ready_->record(caller);
        ready_->wait(comm_stream_);
        comm_stream_used_ = true;
      }
      try {
        DPT_NCCL_CHECK_COMM(ncclGroupStart(), comm_);
        enqueue(stream);
        DPT_NCCL_CHECK_COMM(ncclGroupEnd(), comm_);
        wait_ready(Clock::now() + timeout_, desc.description, timeout_);
      } catch (const std::exception& e) {
        // The communicator is unusable (a peer may already be inside this collective): recorded, the
        // error makes the destructor abort it rather than drain or destroy it, both of which wait for peers.
        state_->set_error(e.what());
        state_->observed = true;
        throw;
      }
    }
    work->end_event().record(stream);
    std::vector<Tensor> finished;  // completed operations' tensors, released after the lock, on this thread
    std::lock_guard<std::mutex> lock(mutex_);
    if (captured) {
      // Nothing runs now. Every replay reads and writes these tensors on the comm stream, beside the
      // graph's compute: their memory must never serve another allocation of the graph.
      for (auto& t : tensors) captured_keep_alive_.push_back(std::move(t));
    } else {
      pending_.push_back(Pending{work, std::move(tensors), Clock::now()});
      finished.swap(finished_);
    }
    return work;
  }

  // Waits for every pending operation (used on destruction); false if the deadline passed first.
  bool drain_pending(Clock::time_point deadline) {
    for (auto& p : pending_) {
      while (!p.work->end_event().query()) {
        if (Clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    return true;
  }

  void watchdog_loop() {
    cuda::DeviceGuard guard(device_);
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        watchdog_cv_.wait_for(lock, kWatchdogPeriod, [this] { return stopping_; });
        if (stopping_) return;
      }
      std::string failure;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        while (!pending_.empty() && pending_.front().work->end_event().query()) {
          // Operations complete in issue order on the one comm stream.
          state_->last_completed = pending_.front().work->desc().seq;
          // The tensors go back on a thread that issues collectives, never on this one: its free could
          // run while another thread captures a CUDA graph, and cudaFreeAsync then fails.
          for (Tensor& t : pending_.front().keep_alive) finished_.push_back(std::move(t));
          pending_.pop_front();
        }
        if (!pending_.empty()) {
          const auto& oldest = pending_.front();
          auto age = Clock::now() - oldest.start;
          if (age > timeout_) {
            failure = fmt::format("NCCL {} (sequence number {}) timed out: not finished after {} ms (timeout {} ms); "
                                  "last completed operation: #{}; a peer died, stalled, or issued different "
                                  "collectives",
                                  oldest.work->desc().description, oldest.work->desc().seq,
                                  std::chrono::duration_cast<std::chrono::milliseconds>(age).count(),
                                  timeout_.count(), state_->last_completed.load());
          }
        }
      }
      if (failure.empty()) {
        // Only between launches: ncclCommGetAsyncError also completes, and frees, the group job a
        // non-blocking launch left in progress (connection setup), so two threads asking at once free it
        // twice and corrupt the heap. A launch under way polls the same error itself (wait_ready).
        ncclResult_t async = ncclSuccess;
        std::unique_lock<std::mutex> between_launches(launch_mutex_, std::try_to_lock);
        if (between_launches.owns_lock()) {
          ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
          if (r != ncclSuccess) async = r;
          between_launches.unlock();
        }
        if (async != ncclSuccess && async != ncclInProgress) {
          std::lock_guard<std::mutex> lock(mutex_);
          std::string op = pending_.empty() ? std::string("(no operation pending)")
                                            : fmt::format("{} (sequence number {})",
                                                          pending_.front().work->desc().description,
                                                          pending_.front().work->desc().seq);
          failure = fmt::format("NCCL communicator error during {}: {} ({}); timeout {} ms", op,
                                ncclGetErrorString(async), ncclGetLastError(comm_), timeout_.count());
        }
      }
      if (!failure.empty()) {
        abort_with(failure);
        return;
      }
    }
  }

  // Records the error, aborts the communicator (with a second-level deadline in case the abort hangs)
  // and makes sure the program hears about it.
  void abort_with(const std::string& failure) {
    state_->set_error(failure);
    std::fprintf(stderr, "[rank %d] %s; aborting the NCCL communicator\n", rank_, failure.c_str());
    std::fflush(stderr);
    auto done = std::make_shared<std::atomic<bool>>(false);
    int rank = rank_;
    std::thread guard([done, rank] {
      auto until = Clock::now() + kAbortDeadline;
      while (!*done && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!*done) {
        std::fprintf(stderr, "[rank %d] ncclCommAbort did not return within %lld s; exiting\n", rank,
                     static_cast<long long>(kAbortDeadline.count()));
        std::fflush(stderr);
        ::_exit(1);
      }
    });
    ncclCommAbort(comm_);
    *done = true;
    guard.join();
    aborted_ = true;
    // The program learns of the error at its next wait() or collective; if it never asks (blocked in
    // something else), end the process rather than leave the job hanging.
    auto until = Clock::now() + kUnobservedErrorGrace;
    while (!state_->observed && Clock::now() < until) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!state_->observed) {
      std::fprintf(stderr, "[rank %d] exiting: %s\n", rank_, failure.c_str());
      std::fflush(stderr);
      ::_exit(1);
    }
  }

  int rank_;
  int size_;
  int device_ = 0;
  Milliseconds timeout_;
  Milliseconds setup_timeout_;  // communicator setup and split
  std::shared_ptr<CommState> state_;
  ncclComm_t setup_comm_ = nullptr;  // non-blocking, used only to create comm_
  ncclComm_t comm_ = nullptr;        // blocking, every operation
  cudaStream_t comm_stream_ = nullptr;
  std::atomic<bool> aborted_{false};
#if DPT_NCCL_HAS_COPY_ENGINES
  std::vector<ncclWindow_t> windows_;  // symmetric windows registered on comm_, deregistered before it goes
#endif

  // One enqueue at a time (the ready_ event is shared), and no NCCL call on comm_ from two threads at once
  // (the watchdog's error poll waits for the launches).
  std::mutex launch_mutex_;
  std::unique_ptr<cuda::CudaEvent> ready_;  // orders the comm stream after the caller's, or the reverse
  bool comm_stream_used_ = false;           // asynchronous operations queued since the last synchronous one

  std::mutex mutex_;  // guards pending_ and stopping_
  std::condition_variable watchdog_cv_;
  std::deque<Pending> pending_;
  std::vector<Tensor> captured_keep_alive_;  // tensors of collectives captured in CUDA graphs
  std::vector<Tensor> finished_;  // of completed operations, released by the next launch outside a capture
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Store> store, int rank, int size,
                                           const BackendOptions& options) {
  return std::make_shared<NcclBackend>(std::move(store), rank, size, options);
}

}  // namespace dpt::dist

#endif  // DPT_HAVE_CUDA
