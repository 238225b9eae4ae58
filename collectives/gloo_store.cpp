#include "collectives/gloo_store.h"

namespace dpt::dist {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, std::string(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  std::string v = store_->get(key);
  return std::vector<char>(v.begin(), v.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { store_->wait(keys, store_->timeout()); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout);
}

}  // namespace dpt::dist
