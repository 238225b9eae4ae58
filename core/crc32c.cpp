#include "core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace dpt {

namespace {

// The reflected Castagnoli polynomial 0x1EDC6F41: bits are processed least significant first.
constexpr uint32_t kPolynomial = 0x82F63B78u;

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

// Both versions work on the register value (the CRC with its pre- and post-inversion removed).
uint32_t update_table(uint32_t state, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) state = kTable[(state ^ p[i]) & 0xFFu] ^ (state >> 8);
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t state, const unsigned char* p, size_t n) {
  uint64_t s = state;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // unaligned load; the instruction takes little-endian words as CRC32C defines
    s = _mm_crc32_u64(s, word);
  }
  auto s32 = static_cast<uint32_t>(s);
  for (; n > 0; ++p, --n) s32 = _mm_crc32_u8(s32, *p);
  return s32;
}

bool have_sse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  const uint32_t state = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~update_sse42(state, p, n);
#endif
  return ~update_table(state, p, n);
}

}  // namespace dpt
