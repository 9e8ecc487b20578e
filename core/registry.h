// Finds the backends: the built-in CPU backend and plugins beside the executable.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/teardown_trace.h"

namespace ct {

struct BackendEntry {
  std::string name;                  // "cpu", "vulkan", ...
  std::string path;                  // plugin file, or "built in"
  std::shared_ptr<Backend> backend;  // null when it could not be loaded
  std::string error;                 // why it could not be loaded or used; empty if usable
};

// Every backend crosstrain knows of, loaded once per process. A plugin that fails to load is
// listed with its reason rather than aborting. The list is never destroyed by a static
// destructor (a driver may have torn itself down by then: NVIDIA's Vulkan driver crashes in
// vkDestroyInstance during exit()); shutdown_backends() destroys the backends instead, and a
// process that never calls it leaves them to the OS.
const std::vector<BackendEntry>& backends();

// Closes everything the backends own, in a defined order, while the drivers are still there:
// the callbacks given to at_backend_shutdown() (latest first), then every backend in reverse
// load order. A backend's driver objects (the Vulkan instance) go with the last device or
// backend that uses them, so every device must be closed by then; one still open keeps them
// until it is closed. main() calls it before returning (tools/crosstrain, the test main, the
// benches); afterwards the entries are listed as unavailable and open_device() refuses.
// Idempotent; call it when no other thread uses a backend or device.
void shutdown_backends();

// Runs `close` at the start of shutdown_backends(): for owners of devices that live as long as
// the process (a test suite's cache of open devices), so that they are closed before their
// backends.
void at_backend_shutdown(std::function<void()> close);

// The first local of a main() that uses the backends: shutdown_backends() when main returns
// (after every other local, devices included, is gone), then the marker "main returned" under
// CROSSTRAIN_TRACE_TEARDOWN=1 (core/teardown_trace.h): a teardown line after it would come from
// a static destructor.
struct ShutdownBackendsOnReturn {
  ShutdownBackendsOnReturn() = default;
  ShutdownBackendsOnReturn(const ShutdownBackendsOnReturn&) = delete;
  ShutdownBackendsOnReturn& operator=(const ShutdownBackendsOnReturn&) = delete;
  ~ShutdownBackendsOnReturn() {
    shutdown_backends();
    trace_teardown("main returned");
  }
};

// Opens "cpu", "vulkan", "vulkan:1", ..., or "auto": the usable device of lowest auto_rank (a
// discrete GPU through CUDA or HIP, else through Vulkan, then an integrated GPU, then cpu:0; the
// test-only simt backends never), the choice printed to stderr. Throws Error(kInvalidArgument)
// naming the known backends and devices when the spec does not match one, with the reason when it
// is unavailable.
std::unique_ptr<Device> open_device(const std::string& spec);
// open_device(spec) with each `name`=`value` set in the environment while the device opens, the
// old values (or their absence) restored afterwards: for the settings a device reads when it
// opens (the GPU device's CT_GPU_TILES and CT_GPU_GEMM), as the tests and benchmarks use them.
std::unique_ptr<Device> open_device_with_env(
    const std::string& spec, std::initializer_list<std::pair<const char*, const char*>> env);

// "cuda:0 (NVIDIA ...), vulkan:0 (...), ..." -- every usable device, or "none".
std::string available_devices();
// --backend auto's order of a device by what it reports (DeviceInfo: type, native_stack,
// test_only): lower is preferred, -1 never.
int auto_rank(const DeviceInfo& d);
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
