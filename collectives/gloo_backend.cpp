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

#include <cctype>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "collectives/backend.h"
#include "collectives/gloo_store.h"
#include "core/bfloat16.h"
#include "core/float16.h"

namespace dpt::dist {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// bfloat16 and float16 (H) reductions: widen to float, reduce, round back (round-to-nearest-even, as
// on the GPU). An inf or NaN in any rank's input stays inf/NaN in the sum.
template <class H>
constexpr bool kIsHalfWidth = std::is_same_v<H, bf16> || std::is_same_v<H, f16>;

template <class H>
void half_sum(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<H*>(c);
  auto* x = static_cast<const H*>(a);
  auto* y = static_cast<const H*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = H(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}
template <class H>
void half_max(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<H*>(c);
  auto* x = static_cast<const H*>(a);
  auto* y = static_cast<const H*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]) >= static_cast<float>(y[i]) ? x[i] : y[i];
}
template <class H>
void half_min(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<H*>(c);
  auto* x = static_cast<const H*>(a);
  auto* y = static_cast<const H*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]) <= static_cast<float>(y[i]) ? x[i] : y[i];
}

template <class T>
ReduceFn reduce_fn(ReduceOp op) {
  if constexpr (kIsHalfWidth<T>) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return &half_sum<T>;
      case ReduceOp::Max: return &half_max<T>;
      case ReduceOp::Min: return &half_min<T>;
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

// Gloo writes to its sockets without MSG_NOSIGNAL, so a peer that dies mid-collective would kill this
// process with SIGPIPE (no message, exit 141) instead of failing the collective with EPIPE. Ignore
// SIGPIPE as Python (and so PyTorch) does, unless the program installed its own handler.
void ignore_sigpipe_if_default() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

// Calls f(T{}) with T the C++ type of `dtype`.
template <class F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32: f(float{}); return;
    case DType::Float64: f(double{}); return;
    case DType::BFloat16: f(bf16{}); return;
    case DType::Float16: f(f16{}); return;
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
    } else if constexpr (kIsHalfWidth<T>) {
      auto* p = static_cast<T*>(data);
      for (size_t i = 0; i < n; ++i) p[i] = T(static_cast<float>(p[i]) / static_cast<float>(size));
    }
  });
}

class GlooBackend : public Backend {
 public:
  GlooBackend(std::shared_ptr<Store> store, int rank, int size, const BackendOptions& options)
      : store_(store), rank_(rank), size_(size), timeout_(options.timeout) {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.local_host.empty() ? "127.0.0.1" : options.local_host;
    ignore_sigpipe_if_default();
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context_->setTimeout(options.timeout);
      GlooStore gloo_store(store);
      context_->connectFullMesh(gloo_store, device_);
      learn_peer_addresses(*store);
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
      // In place (input is this rank's block of output, as ZeRO's all-gather does it): Gloo copies the
      // input into that block with memcpy, which must not see overlapping ranges, so stage it first.
      auto* in = static_cast<uint8_t*>(input.data_ptr());
      auto* out = static_cast<uint8_t*>(output.data_ptr());
      std::vector<uint8_t> staged;
      if (in < out + output.nbytes() && out < in + input.nbytes()) {
        staged.assign(in, in + input.nbytes());
        in = staged.data();
      }
      gloo::AllgatherOptions opts(context_);
      opts.setInput(in, input.nbytes());
      opts.setOutput(out, output.nbytes());
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

  // Gloo's socket errors name the peer by the address of the connection's far end ("Read error
  // [10.0.0.2]:41234: Connection reset by peer"), not by rank, and this Gloo keeps a pair's own socket
  // address private. So once every pair is connected (one byte each way on every pair: the accepting
  // end finishes asynchronously), each rank publishes the local addresses of all its TCP sockets, read
  // from the kernel; any far end named in an error is then one of some rank's local addresses.
  void learn_peer_addresses(Store& store) {
    constexpr uint64_t kSettleSlot = uint64_t{1} << 40;  // above every user tag, below Gloo's slot prefixes
    std::vector<char> out(static_cast<size_t>(size_), 1), in(static_cast<size_t>(size_), 0);
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends, recvs;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      sends.push_back(context_->createUnboundBuffer(&out[static_cast<size_t>(peer)], 1));
      sends.back()->send(peer, kSettleSlot);
      recvs.push_back(context_->createUnboundBuffer(&in[static_cast<size_t>(peer)], 1));
      recvs.back()->recv(peer, kSettleSlot);
    }
    for (auto& b : sends) b->waitSend(timeout_);
    for (auto& b : recvs) b->waitRecv(timeout_);
    std::string mine;
    for (const auto& address : local_tcp_addresses()) mine += address + "\n";
    store.set("dpt_gloo_addresses/" + std::to_string(rank_), mine);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      std::string theirs = store.get("dpt_gloo_addresses/" + std::to_string(peer));
      for (size_t begin = 0, end; (end = theirs.find('\n', begin)) != std::string::npos; begin = end + 1) {
        peer_addresses_.emplace_back(theirs.substr(begin, end - begin), peer);
      }
    }
  }

  // "[127.0.0.1]:41234" for every IPv4 TCP socket this process holds (Linux /proc), each also as this
  // Gloo prints it: its Address::str() shows the port in network byte order ("[127.0.0.1]:12960").
  static std::vector<std::string> local_tcp_addresses() {
    std::set<std::string> inodes;
    std::error_code ec;
    for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
      if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
    std::vector<std::string> out;
    std::ifstream table("/proc/self/net/tcp");
    std::string line;
    std::getline(table, line);  // header
    while (std::getline(table, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      auto colon = local.find(':');
      if (!inodes.count(inode) || colon != 8) continue;
      uint32_t ip = static_cast<uint32_t>(std::stoul(local.substr(0, 8), nullptr, 16));  // host byte order
      unsigned port = static_cast<unsigned>(std::stoul(local.substr(9), nullptr, 16));
      std::string host = fmt::format("[{}.{}.{}.{}]:", ip & 0xff, (ip >> 8) & 0xff, (ip >> 16) & 0xff, ip >> 24);
      out.push_back(host + std::to_string(port));
      out.push_back(host + std::to_string(((port & 0xff) << 8) | (port >> 8)));
    }
    return out;
  }

  // What a failure message can add about the peer behind it. Gloo names the broken connection's address;
  // we name its rank. Survivors fail one after another (a rank that lost the dead peer exits, and its
  // neighbours then lose *it*), so each failing rank records in the store whom it lost, and a rank
  // whose peer had failed first passes on that peer's finding: every survivor names the rank that
  // really went away. When the store is unreachable, its host, rank 0, is gone too.
  std::string explain_failure(const std::string& what) {
    int peer = -1;
    std::string address;
    for (const auto& [a, r] : peer_addresses_) {
      auto at = what.find(a);
      bool whole = at != std::string::npos && (at + a.size() == what.size() || !std::isdigit(what[at + a.size()]));
      if (whole) {
        peer = r;
        address = a;
        break;
      }
    }
    std::string text;
    if (peer >= 0) {
      text = fmt::format("; the peer is rank {} ({}): rank {} has exited or been killed, or the network to it failed",
                         peer, address, peer);
    }
    // A timeout names no connection, and when the network is what failed the store may be unreachable
    // too: asking it could add its own timeout to this rank's exit. Report the timeout as it is.
    if (peer < 0 && what.find("Timed out") != std::string::npos) return text;
    try {
      std::string key = "dpt_gloo_failed/";
      store_->set(key + std::to_string(rank_), std::to_string(peer));
      // Whom did a rank that failed before us lose? Our peer if we know it, else any rank that reports
      // within a second (a survivor that saw the death fails within milliseconds).
      auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(peer >= 0 ? 0 : 1);
      do {
        for (int q = 0; q < size_; ++q) {
          if (q == rank_ || (peer >= 0 && q != peer) || !store_->check({key + std::to_string(q)})) continue;
          int lost = std::stoi(store_->get(key + std::to_string(q)));
          if (lost < 0 || lost == rank_) continue;
          text = peer >= 0 ? fmt::format("; the peer is rank {} ({}), which had failed first after losing rank {}: ",
                                         peer, address, lost)
                           : fmt::format("; rank {} failed too after losing rank {}: ", q, lost);
          text += fmt::format("rank {} has exited or been killed, or the network to it failed", lost);
          return text;
        }
        if (peer < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      } while (std::chrono::steady_clock::now() < give_up);
    } catch (const std::exception&) {
      text += "; the rendezvous store is unreachable as well: rank 0, which hosts it, has exited or been killed";
    }
    return text;
  }

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
        std::string message = fmt::format("Gloo {} failed (timeout {} ms): {}{}", task.desc.description,
                                          timeout_.count(), e.what(), explain_failure(e.what()));
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (first_error_.empty()) first_error_ = message;
        }
        task.work->finish(std::make_exception_ptr(Error(message)));
      }
    }
  }

  std::shared_ptr<Store> store_;  // rendezvous, then failure reports (explain_failure)
  int rank_;
  int size_;
  Milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 0;
  std::vector<std::pair<std::string, int>> peer_addresses_;  // a peer's pair address -> its rank

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
