// The built-in CPU backend: device 0 is the fast path (OpenBLAS + OpenMP), device 1 the readable
// reference every other backend is tested against.
#pragma once

#include <memory>

#include "core/device.h"

namespace ct {

std::shared_ptr<Backend> make_cpu_backend();
// reference = true: plain loops with fp64 accumulation, single-threaded; the oracle.
std::unique_ptr<Device> make_cpu_device(bool reference);

}  // namespace ct
