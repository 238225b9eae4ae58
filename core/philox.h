#pragma once
// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
// One call maps (key, counter) to four independent 32-bit words. Element i of a random draw uses
// counter (i / 4 + offset / 4 ...) — see random_uniform_at — so CPU loops and GPU threads agree.
#include <cmath>
#include <cstdint>

#include "core/bfloat16.h"  // DPT_HOST_DEVICE

namespace dpt::philox {

struct Words {
  uint32_t v[4];
};

DPT_HOST_DEVICE inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

DPT_HOST_DEVICE inline Words philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in (0, 1]: 24 random bits, never 0 so log() in Box-Muller stays finite.
DPT_HOST_DEVICE inline float to_unit_float(uint32_t x) {
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

// Element `index` of the draw that starts at `offset`: a pure function of (seed, offset + index).
// Counter = (offset + index) and a stream tag; word 0 gives the uniform, words 0 and 1 the normal.
DPT_HOST_DEVICE inline float uniform_at(uint64_t seed, uint64_t offset, uint64_t index) {
  return to_unit_float(philox4x32(offset + index, 0, seed).v[0]);
}

// Dropout's uniforms, eight to a Philox call (stream 2): number j of a draw that starts at `offset` is
// 16-bit half (offset + j) % 8 of counter (offset + j) / 8 (half 2k the low bits of word k, 2k + 1 the
// high), so a kernel that takes eight neighbours together makes one call, and a mask does not depend on
// how the kernel groups its elements. A keep decision needs no more than 16 bits: the kept fraction is
// 1 - p to within 2^-16, and the Philox calls, not memory, bound a dropout kernel's time.
constexpr int kDropoutGroup = 8;
DPT_HOST_DEVICE inline float half_of(const Words& w, uint64_t i) {
  const uint32_t word = (i >> 1) == 0 ? w.v[0] : (i >> 1) == 1 ? w.v[1] : (i >> 1) == 2 ? w.v[2] : w.v[3];
  const uint32_t bits = (i & 1) ? word >> 16 : word & 0xFFFFu;
  return (static_cast<float>(bits) + 1.0f) * (1.0f / 65536.0f);  // in (0, 1]
}
DPT_HOST_DEVICE inline Words dropout_words(uint64_t seed, uint64_t group) { return philox4x32(group, 2, seed); }
// half_of(w, i) > p without float conversions: with 16-bit half b, (b + 1) / 2^16 > p exactly when
// b >= floor(p 2^16) (scaling by 2^16 is exact), so a kernel compares integers and keeps the same elements.
// keep_bits has bit i set when half i keeps.
DPT_HOST_DEVICE inline uint32_t keep_threshold(float p) { return static_cast<uint32_t>(::floor(p * 65536.0f)); }
DPT_HOST_DEVICE inline uint32_t keep_bits(const Words& w, uint32_t threshold) {
  uint32_t bits = 0;
  for (int k = 0; k < 4; ++k) {
    bits |= static_cast<uint32_t>((w.v[k] & 0xFFFFu) >= threshold) << (2 * k);
    bits |= static_cast<uint32_t>((w.v[k] >> 16) >= threshold) << (2 * k + 1);
  }
  return bits;
}
DPT_HOST_DEVICE inline float dropout_uniform_at(uint64_t seed, uint64_t offset, uint64_t index) {
  const uint64_t n = offset + index;
  return half_of(dropout_words(seed, n / kDropoutGroup), n % kDropoutGroup);
}

DPT_HOST_DEVICE inline float normal_at(uint64_t seed, uint64_t offset, uint64_t index) {
  Words w = philox4x32(offset + index, 1, seed);
  double u1 = to_unit_float(w.v[0]), u2 = to_unit_float(w.v[1]);
  // Box-Muller, one output per counter. Evaluated in double and rounded once to float: glibc's and
  // CUDA's float logf/cosf differ by an ulp on a visible fraction of inputs, while their double log/cos
  // are within an ulp or two of exact, so the rounded floats agree unless a result lies within ~2^-28
  // relative of a float rounding boundary. Products only (no a * b + c), so FMA contraction on the
  // device cannot change the result either.
  return static_cast<float>(::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2));
}

}  // namespace dpt::philox
