// Typed errors. Library code throws these; only main() turns them into exit codes.
#pragma once

#include <stdexcept>
#include <string>

namespace ct {

enum class ErrorKind {
  kInvalidArgument,  // bad user input: a flag, a file's content, a shape (exit status 2)
  kIo,               // a file could not be read or written
  kDevice,           // a backend failed (driver error, device lost)
  kOutOfMemory,      // an allocation beyond a device limit
  kUnsupported,      // an op/dtype the backend does not offer
  kInternal,         // a broken invariant: a bug in crosstrain
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& what) {
  throw Error(kind, what);
}

}  // namespace ct

// CT_CHECK(cond, msg): an internal invariant; failing it is a bug, reported with its location.
#define CT_CHECK(cond, msg)                                               \
  do {                                                                    \
    if (!(cond))                                                          \
      ::ct::fail(::ct::ErrorKind::kInternal,                              \
                 std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                     ": check `" #cond "` failed: " + std::string(msg));  \
  } while (0)

// CT_REQUIRE(cond, msg): a precondition on caller-supplied arguments (shapes, dtypes).
#define CT_REQUIRE(cond, msg)                                          \
  do {                                                                 \
    if (!(cond)) ::ct::fail(::ct::ErrorKind::kInvalidArgument, (msg)); \
  } while (0)
