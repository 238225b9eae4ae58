// collectives/gloo_store.h: Gloo's view of the TCP rendezvous store keeps the store's values and timeouts.
#include <gtest/gtest.h>

#include <chrono>

#include "collectives/gloo_store.h"
#include "rendezvous/store.h"

namespace dpt::dist {
namespace {

using namespace std::chrono_literals;

TEST(GlooStore, WaitHonoursItsTimeout) {
  auto base = std::make_shared<TcpStore>("127.0.0.1", 0, true, 0, 1, 10s);
  GlooStore gloo_store(base);
  gloo_store.set("addr", {'x', 'y'});
  EXPECT_EQ(gloo_store.get("addr"), (std::vector<char>{'x', 'y'}));
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(gloo_store.wait({"missing"}, std::chrono::milliseconds(100)), StoreTimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace dpt::dist
