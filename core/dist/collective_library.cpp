#include "core/dist/collective_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace ct::dist {
namespace {

// Where a toolkit keeps the library when the loader's path does not name that folder.
std::vector<std::string> toolkit_folders(const std::string& label) {
  std::vector<std::string> dirs;
  auto env = [&](const char* var, const char* sub) {
    if (const char* v = std::getenv(var); v && *v) dirs.push_back(std::string(v) + sub);
  };
  if (label == "RCCL") {
    env("ROCM_PATH", "/lib");
    dirs.push_back("/opt/rocm/lib");
  } else {
    env("CUDA_HOME", "/lib64");
    env("CUDA_PATH", "/lib64");
    dirs.push_back("/usr/local/cuda/lib64");
  }
  return dirs;
}

template <typename Fn>
void bind(void* so, const char* symbol, Fn* slot, const std::string& where) {
  *slot = reinterpret_cast<Fn>(dlsym(so, symbol));
  if (!*slot)
    fail(ErrorKind::kUnsupported, where + " has no " + symbol + ": not a NCCL-compatible library");
}

}  // namespace

CollectiveLibrary load_collective_library(const std::string& file, const std::string& label) {
  std::string path = file, tried = file;
  void* so = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why = so ? "" : dlerror();
  if (!so && file.find('/') == std::string::npos) {
    for (const std::string& dir : toolkit_folders(label)) {
      path = dir + "/" + file;
      tried += ", " + path;
      if ((so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    }
  }
  if (!so)
    fail(ErrorKind::kUnsupported,
         label + " (" + file + ") could not be loaded: " + why + " (tried " + tried + ")");
  CollectiveLibrary lib;
  const std::string where = label + " (" + path + ")";
  bind(so, "ncclGetVersion", &lib.GetVersion, where);
  bind(so, "ncclGetErrorString", &lib.GetErrorString, where);
  bind(so, "ncclGetUniqueId", &lib.GetUniqueId, where);
  bind(so, "ncclCommInitRank", &lib.CommInitRank, where);
  bind(so, "ncclCommDestroy", &lib.CommDestroy, where);
  bind(so, "ncclCommAbort", &lib.CommAbort, where);
  bind(so, "ncclAllReduce", &lib.AllReduce, where);
  bind(so, "ncclReduce", &lib.Reduce, where);
  bind(so, "ncclBroadcast", &lib.Broadcast, where);
  bind(so, "ncclGroupStart", &lib.GroupStart, where);
  bind(so, "ncclGroupEnd", &lib.GroupEnd, where);
  int v = 0;
  if (lib.GetVersion(&v) != nccl::kSuccess)
    fail(ErrorKind::kUnsupported, where + ": ncclGetVersion failed");
  // Since 2.9 the code is major * 10000 + minor * 100 + patch (before: * 1000, * 100).
  const int major = v >= 20900 ? v / 10000 : v / 1000;
  const int minor = v >= 20900 ? v / 100 % 100 : v / 100 % 10;
  lib.name = label + " " + std::to_string(major) + "." + std::to_string(minor) + "." +
             std::to_string(v % 100) + " (" + path + ")";
  return lib;
}

}  // namespace ct::dist
