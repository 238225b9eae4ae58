#pragma once
// Work: the handle an asynchronous collective returns.
//
// CPU (Gloo): the operation runs on the process group's worker thread; wait() blocks the host until it
// finished. CUDA (NCCL): the operation runs on the group's communication stream; wait() makes the
// caller's *current stream* wait for it (an event wait, no host synchronisation), so work queued after
// wait() on that stream sees the result. synchronize() additionally blocks the host.
// A failed or timed-out operation makes wait() throw dpt::Error naming the op, its sequence number and
// the timeout.
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace dpt::dist {

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;             // see above; rethrows the operation's error
  virtual bool is_completed() = 0;     // finished (successfully or not); never blocks
  virtual void synchronize() { wait(); }  // wait() plus a host sync for device work
  virtual std::string describe() const = 0;  // "allreduce #12 (sum, 1024 x float32)"
};

// A Work completed by another thread (the Gloo worker): done once, with or without an error.
class FutureWork : public Work {
 public:
  explicit FutureWork(std::string description) : description_(std::move(description)) {}

  void wait() override;
  bool is_completed() override;
  std::string describe() const override { return description_; }

  void finish(std::exception_ptr error = nullptr);  // called once by the thread that ran it

 private:
  std::string description_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// A Work that is already complete (world of one, empty tensors).
class CompletedWork : public Work {
 public:
  explicit CompletedWork(std::string description) : description_(std::move(description)) {}
  void wait() override {}
  bool is_completed() override { return true; }
  std::string describe() const override { return description_; }

 private:
  std::string description_;
};

}  // namespace dpt::dist
