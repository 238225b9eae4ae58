// Gloo backend: CPU tensors over TCP, using Debian's libgloo (no CUDA in that build).
//
// Collectives run one at a time, in issue order, on a worker thread, so calls return at once and every
// rank runs the same sequence (Gloo matches operations by tag; ours is a per-backend counter). Point-to-
// point sends and receives are posted immediately on the caller's thread (so a send never waits behind a
// collective that needs the peer's matching receive) and completed on a second thread.
//
// Gloo throws when an operation passes its timeout or a peer's connection breaks, and its context is
// unusable afterwards: the first error is kept and every later call fails with it.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <thread>

#include "core/bfloat16.h"
#include "distributed/backend.h"
#include "distributed/gloo_store.h"

namespace dpt::dist {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// bfloat16 reductions: widen to float, reduce, round back (round-to-nearest-even, as on the GPU).
void bf16_sum(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<bf16*>(c);
  auto* x = static_cast<const bf16*>(a);
  auto* y = static_cast<const bf16*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = bf16(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}
void bf16_max(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<bf16*>(c);
  auto* x = static_cast<const bf16*>(a);
  auto* y = static_cast<const bf16*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]) >= static_cast<float>(y[i]) ? x[i] : y[i];
}
void bf16_min(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<bf16*>(c);
  auto* x = static_cast<const bf16*>(a);
  auto* y = static_cast<const bf16*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]) <= static_cast<float>(y[i]) ? x[i] : y[i];
}

template <class T>
ReduceFn reduce_fn(ReduceOp op) {
  if constexpr (std::is_same_v<T, bf16>) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return &bf16_sum;
      case ReduceOp::Max: return &bf16_max;
      case ReduceOp::Min: return &bf16_min;
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return static_cast<ReduceFn>(&gloo::sum<T>);
      case ReduceOp::Max: return static_cast<ReduceFn>(&gloo::max<T>);
      case ReduceOp::Min: return static_cast<ReduceFn>(&gloo::min<T>);
    }
  }
  return nullptr;
}

// Calls f(T{}) with T the C++ type of `dtype`.
template <class F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32: f(float{}); return;
    case DType::Float64: f(double{}); return;
    case DType::BFloat16: f(bf16{}); return;
    case DType::Int32: f(int32_t{}); return;
    case DType::Int64: f(int64_t{}); return;
  }
  DPT_FAIL("Gloo: unsupported dtype {}", dtype_name(dtype));
}

// Average = sum / world size, divided after the sum (exact for the integer-valued test inputs).
void divide(void* data, DType dtype, size_t n, int size) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      auto* p = static_cast<T*>(data);
      for (size_t i = 0; i < n; ++i) p[i] = p[i] / static_cast<T>(size);
    } else if constexpr (std::is_same_v<T, bf16>) {
      auto* p = static_cast<bf16*>(data);
      for (size_t i = 0; i < n; ++i) p[i] = bf16(static_cast<float>(p[i]) / static_cast<float>(size));
    }
  });
}

class GlooBackend : public Backend {
 public:
  GlooBackend(std::shared_ptr<Store> store, int rank, int size, const BackendOptions& options)
      : rank_(rank), size_(size), timeout_(options.timeout) {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.local_host.empty() ? "127.0.0.1" : options.local_host;
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context_->setTimeout(options.timeout);
      GlooStore gloo_store(store);
      context_->connectFullMesh(gloo_store, device_);
    } catch (const std::exception& e) {
      DPT_FAIL("Gloo: rank {} of {} could not connect to its peers (listening on {}, rendezvous through {}): {}",
               rank, size, attr.hostname, store->describe(), e.what());
    }
    worker_ = std::thread([this] { run(collectives_); });
    p2p_worker_ = std::thread([this] { run(p2p_); });
  }

  ~GlooBackend() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
    p2p_worker_.join();
  }

  const char* name() const override { return "gloo"; }

  std::shared_ptr<Work> allreduce(const std::vector<Tensor>& tensors, ReduceOp op, const OpDesc& desc) override {
    return enqueue(collectives_, desc, [this, tensors, op] {
      // Coalesce per dtype: tensors of one dtype are packed into one buffer, reduced with one Gloo call,
      // and unpacked. Every rank passes the same list, so the groups and their order agree.
      std::map<DType, std::vector<Tensor>> by_dtype;
      for (const auto& t : tensors) by_dtype[t.dtype()].push_back(t);
      for (auto& [dtype, group] : by_dtype) {
        if (group.size() == 1) {
          reduce_in_place(group[0].data_ptr(), dtype, static_cast<size_t>(group[0].numel()), op);
          continue;
        }
        size_t total = 0;
        for (const auto& t : group) total += t.nbytes();
        std::vector<char> flat(total);
        size_t offset = 0;
        for (const auto& t : group) {
          std::memcpy(flat.data() + offset, t.data_ptr(), t.nbytes());
          offset += t.nbytes();
        }
        reduce_in_place(flat.data(), dtype, total / dtype_size(dtype), op);
        offset = 0;
        for (const auto& t : group) {
          std::memcpy(t.data_ptr(), flat.data() + offset, t.nbytes());
          offset += t.nbytes();
        }
      }
    });
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root, const OpDesc& desc) override {
    return enqueue(collectives_, desc, [this, tensor, root] {
      if (tensor.nbytes() == 0) return;
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(tensor.data_ptr()), tensor.nbytes());
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  std::shared_ptr<Work> allgather(const Tensor& output, const Tensor& input, const OpDesc& desc) override {
    return enqueue(collectives_, desc, [this, output, input] {
      if (input.nbytes() == 0) return;
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
      opts.setOutput(static_cast<uint8_t*>(output.data_ptr()), output.nbytes());
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  // This Gloo has no options-style reduce-scatter; an allreduce of a copy of the input followed by taking
  // our block gives the same result (twice the traffic of a ring reduce-scatter; fine for CPU tests).
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                       const OpDesc& desc) override {
    return enqueue(collectives_, desc, [this, output, input, op] {
      if (output.nbytes() == 0) return;
      std::vector<char> staging(input.nbytes());
      std::memcpy(staging.data(), input.data_ptr(), input.nbytes());
      reduce_in_place(staging.data(), input.dtype(), static_cast<size_t>(input.numel()), op);
      std::memcpy(output.data_ptr(), staging.data() + output.nbytes() * static_cast<size_t>(rank_), output.nbytes());
    });
  }

  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag, const OpDesc& desc) override {
    return post_p2p(tensor, dst, tag, desc, true);
  }

  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag, const OpDesc& desc) override {
    return post_p2p(tensor, src, tag, desc, false);
  }

  std::shared_ptr<Work> barrier(const OpDesc& desc) override {
    return enqueue(collectives_, desc, [this] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  struct Task {
    std::shared_ptr<FutureWork> work;
    OpDesc desc;
    std::function<void()> fn;
  };

  uint32_t next_tag() { return tag_++; }  // worker thread only

  void reduce_in_place(void* data, DType dtype, size_t n, ReduceOp op) {
    if (n == 0) return;
    dispatch(dtype, [&](auto type_tag) {
      using T = decltype(type_tag);
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(static_cast<T*>(data), n);
      opts.setReduceFunction(reduce_fn<T>(op));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
    if (op == ReduceOp::Avg) divide(data, dtype, n, size_);
  }

  std::shared_ptr<Work> enqueue(std::deque<Task>& queue, const OpDesc& desc, std::function<void()> fn) {
    auto work = std::make_shared<FutureWork>(desc.description);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue.push_back(Task{work, desc, std::move(fn)});
    }
    cv_.notify_all();
    return work;
  }

  std::shared_ptr<Work> post_p2p(const Tensor& tensor, int peer, int tag, const OpDesc& desc, bool is_send) {
    if (tensor.nbytes() == 0) return std::make_shared<CompletedWork>(desc.description);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!first_error_.empty()) DPT_FAIL("Gloo {} refused: the process group failed earlier: {}", desc.description,
                                          first_error_);
    }
    std::shared_ptr<gloo::transport::UnboundBuffer> buffer =
        context_->createUnboundBuffer(tensor.data_ptr(), tensor.nbytes());
    // Slot = the user's tag; Gloo's collectives use slots with a non-zero prefix byte, so they never meet.
    if (is_send) {
      buffer->send(peer, static_cast<uint64_t>(tag));
    } else {
      buffer->recv(peer, static_cast<uint64_t>(tag));
    }
    return enqueue(p2p_, desc, [this, buffer, tensor, is_send] {
      if (is_send) {
        buffer->waitSend(timeout_);
      } else {
        buffer->waitRecv(timeout_);
      }
    });
  }

  void run(std::deque<Task>& queue) {
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue.empty(); });
        if (queue.empty()) return;  // stopping and drained
        task = std::move(queue.front());
        queue.pop_front();
        if (stopping_ || !first_error_.empty()) {
          std::string why = stopping_ ? "the process group is being destroyed"
                                      : "the process group failed earlier: " + first_error_;
          lock.unlock();
          task.work->finish(std::make_exception_ptr(Error(fmt::format("Gloo {} not run: {}", task.desc.description, why))));
          continue;
        }
      }
      try {
        task.fn();
        task.work->finish();
      } catch (const std::exception& e) {
        std::string message = fmt::format("Gloo {} failed (timeout {} ms): {}", task.desc.description,
                                          timeout_.count(), e.what());
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (first_error_.empty()) first_error_ = message;
        }
        task.work->finish(std::make_exception_ptr(Error(message)));
      }
    }
  }

  int rank_;
  int size_;
  Milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 0;

  std::mutex mutex_;  // guards the queues, stopping_ and first_error_
  std::condition_variable cv_;
  std::deque<Task> collectives_;
  std::deque<Task> p2p_;
  bool stopping_ = false;
  std::string first_error_;
  std::thread worker_;
  std::thread p2p_worker_;
};

}  // namespace

std::shared_ptr<Backend> make_gloo_backend(std::shared_ptr<Store> store, int rank, int size,
                                           const BackendOptions& options) {
  return std::make_shared<GlooBackend>(std::move(store), rank, size, options);
}

}  // namespace dpt::dist
