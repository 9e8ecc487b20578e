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

// Opens "cpu", "vulkan", "vulkan:1", ..., or "auto": the first usable of cuda > hip > discrete
// Vulkan > integrated Vulkan > cpu:0 (the test-only simt backends never), the choice printed to
// stderr. Throws Error(kInvalidArgument) naming the known
// backends and devices when the spec does not match one, with the reason when it is unavailable.
std::unique_ptr<Device> open_device(const std::string& spec);

// "cuda:0 (NVIDIA ...), vulkan:0 (...), ..." -- every usable device, or "none".
std::string available_devices();
// The device `auto` picks (see open_device); *why, if given, says what it chose and why the
// backends it passed over are unavailable.
std::string choose_auto_device(std::string* why);

// The backends compiled into the core library (today: cpu), in the order they are listed. Core
// does not include any backend: the translation unit that defines this function lives with the
// built-in backends (backends/cpu/builtin_backends.cpp), and backends() is the only caller.
std::vector<std::shared_ptr<Backend>> builtin_backends();

// Directory holding the running executable (where plugins are looked for).
std::string executable_dir();

}  // namespace ct
