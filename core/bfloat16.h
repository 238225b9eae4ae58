#pragma once
// bfloat16 storage type usable on host and device: the upper 16 bits of an IEEE float32.
// Conversion rounds to nearest even, as CUDA's __float2bfloat16 does, so CPU and GPU agree bit for bit.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DPT_HOST_DEVICE __host__ __device__
#else
#define DPT_HOST_DEVICE
#endif

namespace dpt {

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  DPT_HOST_DEVICE explicit bf16(float f) : bits(round_to_bf16(f)) {}
  DPT_HOST_DEVICE operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
  }

  DPT_HOST_DEVICE static uint16_t round_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a quiet NaN
    uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);  // ties go to the even mantissa
    return static_cast<uint16_t>((u + rounding_bias) >> 16);
  }
};

}  // namespace dpt
