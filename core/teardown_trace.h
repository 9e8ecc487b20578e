// CROSSTRAIN_TRACE_TEARDOWN=1: one line on stderr as each object that owns driver state (a
// backend, a device, the Vulkan instance) is created or destroyed, and when main() returns
// (tools/crosstrain, tests/tools/teardown_probe), so a test can check that nothing is torn down
// from a static destructor after main (tests/tools/teardown_test.cpp). Header-only: the plugins
// use it without linking the core.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ct {

inline bool teardown_traced() {
  static const bool on = [] {
    const char* v = std::getenv("CROSSTRAIN_TRACE_TEARDOWN");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// "crosstrain teardown: <what>" on stderr when traced.
// stdout is flushed first: where both go to one pipe, a trace line then starts a line of its own
// instead of landing inside a half-written block of stdout.
inline void trace_teardown(const std::string& what) {
  if (!teardown_traced()) return;
  std::fflush(stdout);
  std::fprintf(stderr, "crosstrain teardown: %s\n", what.c_str());
}

}  // namespace ct
