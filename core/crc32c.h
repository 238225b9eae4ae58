#pragma once
// CRC32C (Castagnoli polynomial, as in iSCSI, ext4 and Google's crc32c library): the checksum a
// checkpoint stores per tensor. Computed with the CPU's crc32 instruction where there is one (SSE4.2),
// else a table; both give the same value, crc32c("123456789") = 0xE3069283.
#include <cstddef>
#include <cstdint>

namespace dpt {

// The CRC32C of `n` bytes, continuing from `crc` (the value of the bytes before them; 0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace dpt
