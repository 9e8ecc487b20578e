// Host facts for the CPU device description and its memory limit.
#pragma once

#include <cstdint>
#include <string>

namespace ct::cpu {

std::string cpu_model_name();      // "model name" from /proc/cpuinfo
std::string cpu_isa_flags();       // the SIMD flags that matter here, space-separated
int64_t total_memory_bytes();      // sysinfo totalram
int64_t available_memory_bytes();  // MemAvailable from /proc/meminfo (includes reclaimable cache)
int64_t free_memory_fast_bytes();  // sysinfo freeram: a cheap lower bound of the above
int cpu_threads();                 // OpenMP threads the fast path uses

}  // namespace ct::cpu
