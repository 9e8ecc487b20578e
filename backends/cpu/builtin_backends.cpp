// The list of backends built into the core library, for core/registry.cpp: the one place where
// core meets a backend's own header.
#include "backends/cpu/cpu_backend.h"
#include "core/registry.h"

namespace ct {

std::vector<std::shared_ptr<Backend>> builtin_backends() {
  return {make_cpu_backend()};
}

}  // namespace ct
