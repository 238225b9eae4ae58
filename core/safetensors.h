#pragma once
// safetensors: named tensors <-> one file, in the format of huggingface/safetensors, so that
// `safetensors.torch.load_file` reads what we write and we read what PyTorch writes.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON (starts with '{', padded with spaces
// to a multiple of 8), then the raw little-endian data. Each entry is
//   "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// with offsets relative to the start of the data; an optional "__metadata__" maps strings to strings.
// The loader trusts nothing: header size, JSON syntax, dtypes, shapes, overflow, offsets tiling the
// data with no hole or overlap, byte counts and the file size are all checked, each with its own error.
// Every count is bounded before anything is allocated for it (header bytes, tensors, metadata entries,
// dimensions), so a hostile header costs memory in proportion to what a real file of its size holds.
//
// Checksums: the writer stores a CRC32C of each tensor's bytes in __metadata__ as
//   "crc32c.<tensor name>": "<8 hex digits>"
// and the loader verifies every one it finds. Files written before checksums existed (or by other
// writers) have none and load unverified; SafetensorsContents::checksummed tells which kind was read.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace dpt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using SafetensorsMetadata = std::map<std::string, std::string>;

// Thrown when a file's own bytes prove it damaged or not a safetensors file (header, sizes, checksums).
// A file that could not be read at all (missing, permissions, an I/O error, not a regular file, out of
// memory) throws a plain dpt::Error or std::bad_alloc instead: a caller that passes over damaged files
// must never pass over one that is merely unreadable today.
class DamagedFile : public Error {
 public:
  using Error::Error;
};

struct SafetensorsContents {
  NamedTensors tensors;          // CPU tensors, in the order of their data in the file
  SafetensorsMetadata metadata;  // the "__metadata__" entry (empty when absent), without the checksums
  bool checksummed = false;      // every tensor carried a CRC32C and matched it (true for no tensors)

  bool contains(const std::string& name) const;
  const Tensor& at(const std::string& name) const;  // throws naming `name` when absent
};

// Largest header we accept (the reference implementation's limit): a bigger one is damage or an attack.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100u * 1000u * 1000u;
// Most dimensions of a tensor, tensors in a file, and __metadata__ entries (a checksum per tensor plus
// the writer's own) we accept; real files are far below each.
inline constexpr size_t kSafetensorsMaxRank = 8;
inline constexpr size_t kSafetensorsMaxTensors = size_t{1} << 18;
inline constexpr size_t kSafetensorsMaxMetadata = kSafetensorsMaxTensors + 4096;
// The __metadata__ key of a tensor's checksum; save_safetensors refuses caller metadata under it.
inline constexpr const char* kSafetensorsChecksumPrefix = "crc32c.";

// Writes atomically: a unique temporary file in the same directory, fsync, rename over `path`, fsync
// the directory. A crash at any point leaves either the old file or the new one, never a torn one.
// Tensors may live on any device and have any strides; names must be unique and non-empty.
// Entries are ordered by alignment (larger element size first) then name, as the reference writer does.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const SafetensorsMetadata& metadata = {});

// Reads and validates a whole file into CPU tensors. Errors name the file and the kind of damage
// (DamagedFile) or why it could not be read (dpt::Error). Only regular files are opened: a FIFO, a device
// or a directory is refused without blocking.
SafetensorsContents load_safetensors(const std::string& path);

// safetensors dtype names ("F32", "BF16", "F16", "F64", "I32", "I64") for the dtypes a Tensor can hold.
const char* safetensors_dtype_name(DType dtype);

// Writes `bytes` to `path` with the same atomic protocol as save_safetensors.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace dpt
