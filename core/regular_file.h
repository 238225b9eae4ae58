#pragma once
// Opening a file that must be a regular file: a FIFO given as a data or checkpoint file would block
// open() until a writer came (for good, and deaf to stop signals), and a directory or device is never
// what a reader wants.
#include <cstdint>
#include <string>

namespace dpt {

// A read-only descriptor (close-on-exec) of `path` and its size. Opens without blocking and refuses
// anything but a regular file: "cannot open <what> '<path>': <reason>" or "<what> '<path>' is a FIFO,
// not a regular file". The caller closes the descriptor.
struct RegularFile {
  int fd = -1;
  int64_t size = 0;
};
RegularFile open_regular_file(const std::string& path, const std::string& what);

}  // namespace dpt
