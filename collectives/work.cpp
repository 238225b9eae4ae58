#include "collectives/work.h"

namespace dpt::dist {

void FutureWork::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool FutureWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void FutureWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

}  // namespace dpt::dist
