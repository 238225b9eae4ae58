#pragma once
// Counter-based random numbers for data generation: value i of stream s is a pure function of
// (seed, s, i), so a dataset's example depends only on its index — never on the order examples were
// produced in, the number of loader threads, or the rank that asks for it.
#include <cmath>
#include <cstdint>

#include "core/philox.h"

namespace dpt::data::random {

inline uint64_t bits64(uint64_t seed, uint64_t stream, uint64_t index) {
  philox::Words w = philox::philox4x32(index, stream, seed);
  return (static_cast<uint64_t>(w.v[0]) << 32) | w.v[1];
}

// Uniform in [0, 1) with 53 random bits.
inline double uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<double>(bits64(seed, stream, index) >> 11) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box-Muller on two independent uniforms of the same counter.
inline double normal(uint64_t seed, uint64_t stream, uint64_t index) {
  philox::Words w = philox::philox4x32(index, stream, seed);
  double u1 = (static_cast<double>(w.v[0]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]: log stays finite
  double u2 = static_cast<double>(w.v[1]) * (1.0 / 4294967296.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Uniform integer in [0, bound) by the multiply-high method (bias below 2^-64 * bound).
inline uint64_t below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits64(seed, stream, index)) * bound) >> 64);
}

}  // namespace dpt::data::random
