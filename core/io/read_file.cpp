#include "core/io/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ct {

std::string read_file_bytes(const std::string& path) {
  auto fail_errno = [&](const char* what, int err) {
    fail(ErrorKind::kIo, std::string(what) + " '" + path + "': " + std::strerror(err));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open", errno);
  std::string out;
  try {
    struct stat st;
    if (::fstat(fd, &st) != 0) fail_errno("cannot stat", errno);
    if (!S_ISREG(st.st_mode)) fail(ErrorKind::kIo, "'" + path + "' is not a regular file");
    out.reserve(static_cast<size_t>(st.st_size));
    char buf[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_errno("cannot read", errno);
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

}  // namespace ct
