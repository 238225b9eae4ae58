// libFuzzer target: the safetensors reader on arbitrary bytes. Any outcome but a dpt::Error or a
// well-formed result (a crash, a sanitizer report, another exception type, a hang) is a finding, and so
// is a result or a cost outside the reader's bounds:
//   - a tensor of more than kSafetensorsMaxRank dimensions, more than kSafetensorsMaxTensors tensors,
//     a tensor whose byte count is not numel x element size;
//   - a checksum entry left in the metadata (the reader takes them all out);
//   - heap memory at any point of the read larger than kMemoryPerByte x the input's size plus
//     kMemorySlack: a header can only make the reader hold a small multiple of its own length (before
//     the bounds, a 2-byte shape item cost ~100 bytes and a 90 MB header 6.5 GB).
// The fuzzer's inputs are at most 64 KiB (scripts/fuzz.sh), so the memory bound is the one that catches
// an unbounded container: at that size no absolute limit would.
#include <sanitizer/allocator_interface.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/safetensors.h"
#include "input_file.h"

namespace {

constexpr size_t kMemoryPerByte = 32;
constexpr size_t kMemorySlack = 256 * 1024;

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_live{0}, g_peak{0};

void on_malloc(const volatile void*, size_t size) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  const int64_t live =
      g_live.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed) + static_cast<int64_t>(size);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

void on_free(const volatile void* ptr) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  g_live.fetch_sub(static_cast<int64_t>(__sanitizer_get_allocated_size(const_cast<const void*>(ptr))),
                   std::memory_order_relaxed);
}

const int g_hooks = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)g_hooks;
  dpt::fuzz::InputFile file(data, size);
  g_live = 0;
  g_peak = 0;
  g_counting = true;
  try {
    auto contents = dpt::load_safetensors(file.path());
    g_counting = false;
    if (contents.tensors.size() > dpt::kSafetensorsMaxTensors) __builtin_trap();
    for (const auto& [key, value] : contents.metadata) {
      if (key.rfind(dpt::kSafetensorsChecksumPrefix, 0) == 0) __builtin_trap();
    }
    // Touch every byte the reader claims to hold, so a tensor pointing outside its storage shows up.
    volatile uint8_t sink = 0;
    for (const auto& [name, tensor] : contents.tensors) {
      if (tensor.shape().size() > dpt::kSafetensorsMaxRank) __builtin_trap();
      if (tensor.nbytes() != static_cast<size_t>(tensor.numel()) * dpt::dtype_size(tensor.dtype())) __builtin_trap();
      const auto* bytes = static_cast<const uint8_t*>(tensor.data_ptr());
      for (size_t i = 0; i < tensor.nbytes(); ++i) sink = sink ^ bytes[i];
    }
  } catch (const dpt::Error&) {
  }
  g_counting = false;
  if (g_peak.load() > static_cast<int64_t>(kMemoryPerByte * size + kMemorySlack)) __builtin_trap();
  return 0;
}
