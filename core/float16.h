#pragma once
// IEEE 754 binary16 (half precision) storage type usable on host and device: 1 sign bit, 5 exponent
// bits (bias 15), 10 mantissa bits. Largest finite value 65504, smallest normal 2^-14, smallest
// subnormal 2^-24. Conversion from float rounds to nearest even, overflows to infinity and keeps
// subnormals, as CUDA's __float2half_rn does, so CPU and GPU agree bit for bit.
#include <cstdint>
#include <cstring>

#include "core/bfloat16.h"  // DPT_HOST_DEVICE

namespace dpt {

struct f16 {
  uint16_t bits = 0;

  f16() = default;
  DPT_HOST_DEVICE explicit f16(float f) : bits(round_to_f16(f)) {}
  DPT_HOST_DEVICE operator float() const { return to_float(bits); }

  DPT_HOST_DEVICE static uint16_t round_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN stays a quiet NaN
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to infinity
    if (abs < 0x38800000u) {
      // Below 2^-14: a subnormal half, m * 2^-24 with m = round(|f| * 2^24). Adding 0.5 (2^-1) to |f|
      // puts the bits for 2^-24 units at the bottom of the float mantissa, and the float addition
      // itself rounds to nearest even; the difference of the bit patterns is m.
      float a;
      memcpy(&a, &abs, sizeof(a));
      const float shifted = a + 0.5f;
      uint32_t s;
      memcpy(&s, &shifted, sizeof(s));
      return static_cast<uint16_t>(sign | (s - 0x3f000000u));
    }
    // Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits, ties to even.
    const uint32_t odd = (abs >> 13) & 1u;
    const uint32_t rebased = abs - (static_cast<uint32_t>(127 - 15) << 23);
    return static_cast<uint16_t>(sign | ((rebased + 0xfffu + odd) >> 13));
  }

  DPT_HOST_DEVICE static float to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) {
      u = sign | 0x7f800000u | (mant << 13);  // infinity or NaN
    } else if (exp == 0) {
      // Zero or subnormal: mant * 2^-24, exact in float.
      float m = static_cast<float>(mant) * 5.9604644775390625e-8f;
      memcpy(&u, &m, sizeof(u));
      u |= sign;
    } else {
      u = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
  }
};

}  // namespace dpt
