// Crash-safe file replacement: write a temp file beside the target, fsync it, rename it over the
// target, fsync the folder. Readers see either the old file or the complete new one, never a
// partial write.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace ct {

// Sequential writer handed to the fill callback of write_file_atomic.
class FileSink {
 public:
  FileSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  // Appends `bytes` bytes; throws Error(kIo) naming the file on failure (short writes retried).
  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  size_t bytes_written() const { return written_; }

 private:
  int fd_;
  std::string path_;
  size_t written_ = 0;
};

// Replaces `path` atomically with what `fill` writes: to `<path>.tmp-<pid>` in the same folder,
// fsync, rename over `path`, fsync the folder. If anything fails (including an exception thrown by
// `fill`), the temp file is removed, a previous file at `path` is left untouched, and the error
// propagates (Error(kIo) naming the path for I/O failures).
void write_file_atomic(const std::string& path, const std::function<void(FileSink&)>& fill);

// The same for a file whose whole content is in memory.
void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace ct
