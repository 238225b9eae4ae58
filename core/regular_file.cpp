#include "core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace dpt {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

}  // namespace

RegularFile open_regular_file(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below like any non-file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  DPT_CHECK(fd >= 0, "cannot open {} '{}': {}", what, path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    DPT_FAIL("cannot stat {} '{}': {}", what, path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    DPT_FAIL("{} '{}' is {}, not a regular file", what, path, file_kind(st.st_mode));
  }
  return {fd, static_cast<int64_t>(st.st_size)};
}

}  // namespace dpt
