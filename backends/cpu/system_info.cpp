// What the CPU device reports about the machine: processor model, ISA flags, memory, threads.
#include "backends/cpu/system_info.h"

#include <omp.h>
#include <sys/sysinfo.h>

#include <fstream>
#include <set>
#include <sstream>

namespace ct::cpu {

static std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  size_t b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

static std::string cpuinfo_field(const std::string& key) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (trim(line.substr(0, colon)) == key) return trim(line.substr(colon + 1));
  }
  return "";
}

std::string cpu_model_name() {
  std::string m = cpuinfo_field("model name");
  return m.empty() ? "unknown processor" : m;
}

std::string cpu_isa_flags() {
  static const char* kInteresting[] = {"avx",         "avx2",        "fma",      "f16c",
                                       "avx512f",     "avx512bw",    "avx512vl", "avx512_bf16",
                                       "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile"};
  std::istringstream is(cpuinfo_field("flags"));
  std::set<std::string> have;
  for (std::string w; is >> w;) have.insert(w);
  std::string out;
  for (const char* f : kInteresting)
    if (have.count(f)) {
      if (!out.empty()) out += ' ';
      out += f;
    }
  return out.empty() ? "none" : out;
}

int64_t total_memory_bytes() {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return 0;
  return static_cast<int64_t>(si.totalram) * si.mem_unit;
}

int64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return 0;
  return static_cast<int64_t>(si.freeram + si.bufferram) * si.mem_unit;
}

int64_t free_memory_fast_bytes() {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return 0;
  return static_cast<int64_t>(si.freeram) * si.mem_unit;
}

int cpu_threads() {
  return omp_get_max_threads();
}

}  // namespace ct::cpu
