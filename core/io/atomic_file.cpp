#include "core/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace ct {
namespace {

[[noreturn]] void fail_io(const std::string& what, const std::string& path, int err) {
  fail(ErrorKind::kIo, what + " '" + path + "': " + std::strerror(err));
}

// Makes the rename itself durable. Some filesystems cannot fsync a folder (EINVAL); nothing more
// can be done there, so that is not an error.
void fsync_parent_dir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::string dir = parent.empty() ? std::string(".") : parent.string();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_io("cannot open folder to sync", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != EROFS) fail_io("cannot fsync folder", dir, err);
}

}  // namespace

void FileSink::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_io("cannot write", path_, errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void write_file_atomic(const std::string& path, const std::function<void(FileSink&)>& fill) {
  if (path.empty()) fail(ErrorKind::kInvalidArgument, "write_file_atomic: empty path");
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fail(ErrorKind::kIo, "cannot write '" + path + "': cannot create temporary file '" + tmp +
                             "': " + std::strerror(errno));
  }
  try {
    FileSink sink(fd, tmp);
    fill(sink);
    if (::fsync(fd) != 0) fail_io("cannot fsync", tmp, errno);
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail_io("cannot close", tmp, errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      fail_io("cannot rename '" + tmp + "' onto", path, errno);
    }
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_parent_dir(path);
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  write_file_atomic(path, [&](FileSink& sink) { sink.write(contents); });
}

}  // namespace ct
