#pragma once
// Adapter that lets Gloo's rendezvous (connectFullMesh) run over our store. Debian's Gloo has no TCP
// store of its own, and its Store base class ignores the timeout of wait(keys, timeout): we override
// both forms so every rendezvous step is bounded and a missing rank is named.
#include <gloo/rendezvous/store.h>

#include <memory>

#include "rendezvous/store.h"

namespace dpt::dist {

class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<dist::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<dist::Store> store_;
};

}  // namespace dpt::dist
