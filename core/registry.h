// Finds the backends: the built-in CPU backend and plugins beside the executable.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"

namespace ct {

struct BackendEntry {
  std::string name;                  // "cpu", "vulkan", ...
  std::string path;                  // plugin file, or "built in"
  std::shared_ptr<Backend> backend;  // null when it could not be loaded
  std::string error;                 // why it could not be loaded or used; empty if usable
};

// Every backend crosstrain knows of, loaded once per process. A plugin that fails to load is
// listed with its reason rather than aborting.
const std::vector<BackendEntry>& backends();

// Opens "cpu", "vulkan", "vulkan:1", ... Throws Error(kInvalidArgument) naming the known
// backends and devices when the spec does not match one, with the reason when it is unavailable.
std::unique_ptr<Device> open_device(const std::string& spec);

// The backends compiled into the core library (today: cpu), in the order they are listed. Core
// does not include any backend: the translation unit that defines this function lives with the
// built-in backends (backends/cpu/builtin_backends.cpp), and backends() is the only caller.
std::vector<std::shared_ptr<Backend>> builtin_backends();

// Directory holding the running executable (where plugins are looked for).
std::string executable_dir();

}  // namespace ct
