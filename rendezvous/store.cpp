#include "rendezvous/store.h"

#include <algorithm>

namespace dpt::dist {

void Store::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  auto missing = wait_for(keys, timeout);
  if (missing.empty()) return;
  std::string names;
  for (const auto& k : missing) names += (names.empty() ? "'" : ", '") + k + "'";
  std::string message = fmt::format("{}: timed out after {} ms waiting for {} of {} keys; missing: {}", describe(),
                                    timeout.count(), missing.size(), keys.size(), names);
  throw StoreTimeoutError(message, std::move(missing));
}

void Store::barrier(const std::string& name, Milliseconds timeout) {
  int64_t generation;
  {
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    generation = barrier_generation_[name]++;
  }
  // Each rank announces itself under its own key, so a timeout can say exactly who is missing.
  std::string base = "barrier/" + name + "/" + std::to_string(generation) + "/";
  set(base + std::to_string(rank_), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(base + std::to_string(r));
  std::vector<std::string> missing;
  std::string what = fmt::format("timed out after {} ms", timeout.count());
  bool shut_down = false;
  try {
    missing = wait_for(keys, timeout);
  } catch (const StoreShutdownError& e) {
    missing = e.missing;
    what = "ended early: rank 0, which hosts the store, shut down";
    shut_down = true;
  }
  if (missing.empty()) {
    leave_barrier(base, timeout);
    return;
  }
  std::vector<int> ranks;
  for (const auto& k : missing) ranks.push_back(std::stoi(k.substr(base.size())));
  std::sort(ranks.begin(), ranks.end());
  std::string message = fmt::format("{}: barrier '{}' {} on rank {}; {} of {} ranks never arrived: {}", describe(),
                                    name, what, rank_, ranks.size(), world_size_, fmt::join(ranks, ", "));
  if (shut_down) throw StoreShutdownError(message, std::move(missing));
  throw StoreTimeoutError(message, std::move(missing));
}

// Rank 0 leaves a barrier last. It usually hosts the store, and if it left first (to exit on an error
// found right after the barrier, say) it would cut off ranks still reading the barrier's keys: they
// would report a lost connection instead of the error. So every other rank marks its departure, and
// rank 0 waits for those marks, bounded by the timeout (a rank that dies after arriving cannot hold it).
void Store::leave_barrier(const std::string& base, Milliseconds timeout) {
  if (rank_ != 0) {
    set(base + "left/" + std::to_string(rank_), "1");
    return;
  }
  std::vector<std::string> left;
  for (int r = 1; r < world_size_; ++r) left.push_back(base + "left/" + std::to_string(r));
  try {
    wait_for(left, timeout);
  } catch (const StoreShutdownError&) {
    // Not the host after all (a sub-group), and the host is gone: nothing left to protect.
  }
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : PrefixStore(std::move(prefix), base, base->rank(), base->world_size()) {}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base, int rank, int world_size)
    : Store(rank, world_size, base->timeout()), prefix_(std::move(prefix)), base_(std::move(base)) {}

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

// The base's timeout is used for blocking calls of the base; keep it in step with ours.
void PrefixStore::set(const std::string& k, const std::string& value) { base_->set(key(k), value); }

std::string PrefixStore::get(const std::string& k) {
  auto saved = base_->timeout();
  base_->set_timeout(timeout_);
  try {
    auto v = base_->get(key(k));
    base_->set_timeout(saved);
    return v;
  } catch (...) {
    base_->set_timeout(saved);
    throw;
  }
}

int64_t PrefixStore::add(const std::string& k, int64_t delta) { return base_->add(key(k), delta); }

bool PrefixStore::check(const std::vector<std::string>& ks) { return base_->check(keys(ks)); }

std::vector<std::string> PrefixStore::wait_for(const std::vector<std::string>& ks, Milliseconds timeout) {
  auto strip = [&](std::vector<std::string> missing) {
    for (auto& m : missing) m = m.substr(prefix_.size() + 1);
    return missing;
  };
  try {
    return strip(base_->wait_for(keys(ks), timeout));
  } catch (const StoreShutdownError& e) {
    throw StoreShutdownError(e.what(), strip(e.missing));
  }
}

bool PrefixStore::remove(const std::string& k) { return base_->remove(key(k)); }

std::string PrefixStore::describe() const { return base_->describe() + " (prefix '" + prefix_ + "/')"; }

}  // namespace dpt::dist
