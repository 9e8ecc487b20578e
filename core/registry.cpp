#include "core/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/teardown_trace.h"

namespace ct {
namespace fs = std::filesystem;

std::string executable_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  return exe.parent_path().string();
}

static BackendEntry load_plugin(const fs::path& path) {
  BackendEntry e;
  std::string stem = path.stem().string();  // libcrosstrain_backend_vulkan
  e.name = stem.substr(std::string("libcrosstrain_backend_").size());
  e.path = path.string();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    e.error = std::string("cannot load ") + path.filename().string() + ": " + dlerror();
    return e;
  }
  auto abi = reinterpret_cast<BackendAbiVersionFn>(dlsym(handle, CT_BACKEND_ABI_SYMBOL));
  auto create = reinterpret_cast<BackendCreateFn>(dlsym(handle, CT_BACKEND_CREATE_SYMBOL));
  if (!abi || !create) {
    e.error = path.filename().string() + " does not export " CT_BACKEND_CREATE_SYMBOL;
    return e;
  }
  if (abi() != kBackendAbiVersion) {
    e.error = path.filename().string() + " was built for backend ABI " + std::to_string(abi()) +
              ", this crosstrain expects " + std::to_string(kBackendAbiVersion);
    return e;
  }
  try {
    e.backend.reset(create());  // the library stays loaded for the life of the process
    e.error = e.backend->unavailable_reason();
  } catch (const std::exception& ex) {
    e.error = ex.what();
  }
  return e;
}

// Every backend: the built-in ones, the plugins found, and the GPU backends not built.
static std::vector<BackendEntry> load_backends() {
  std::vector<BackendEntry> v;
  for (auto& b : builtin_backends()) v.push_back({b->name(), "built in", b, ""});
  std::vector<fs::path> dirs = {executable_dir()};
  if (const char* extra = std::getenv("CROSSTRAIN_BACKEND_DIR")) dirs.insert(dirs.begin(), extra);
  std::vector<fs::path> found;
  for (const auto& dir : dirs) {
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(dir, ec)) {
      std::string n = f.path().filename().string();
      if (n.rfind("libcrosstrain_backend_", 0) == 0 && f.path().extension() == ".so")
        found.push_back(f.path());
    }
  }
  std::sort(found.begin(), found.end());
  // CROSSTRAIN_BACKENDS=cpu,simt: load only the plugins named (a driver that misbehaves when
  // merely probed stays out of the process); the others are listed, unavailable, with the reason.
  std::vector<std::string> only;
  if (const char* list = std::getenv("CROSSTRAIN_BACKENDS"); list && *list) {
    std::stringstream ss(list);
    for (std::string n; std::getline(ss, n, ',');)
      if (!n.empty()) only.push_back(n);
  }
  for (const auto& p : found) {
    const std::string name = p.stem().string().substr(std::string("libcrosstrain_backend_").size());
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) {
      if (std::none_of(v.begin(), v.end(), [&](const BackendEntry& x) { return x.name == name; }))
        v.push_back({name, p.string(), nullptr,
                     "not loaded: CROSSTRAIN_BACKENDS=" +
                         std::string(std::getenv("CROSSTRAIN_BACKENDS")) + " does not name it"});
      continue;
    }
    BackendEntry e = load_plugin(p);
    bool dup =
        std::any_of(v.begin(), v.end(), [&](const BackendEntry& x) { return x.name == e.name; });
    if (!dup) v.push_back(std::move(e));
  }
  // The GPU backends crosstrain knows of are listed even where this build has no plugin for
  // them, with the reason, so that `crosstrain devices` answers "why not" for each.
  for (const char* name : {"cuda", "hip", "vulkan"}) {
    bool have =
        std::any_of(v.begin(), v.end(), [&](const BackendEntry& x) { return x.name == name; });
    if (have) continue;
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    v.push_back({name, "(not built)", nullptr,
                 "libcrosstrain_backend_" + std::string(name) + ".so is not beside " +
                     executable_dir() + " (this build has no " + upper +
                     " backend: configure with -DCT_BACKEND_" + upper +
                     "=ON where its compiler is installed)"});
  }
  return v;
}

namespace {

// Leaked on purpose: never destroyed by exit() (see backends()).
struct RegistryState {
  std::vector<BackendEntry> list;
  std::vector<std::function<void()>> at_shutdown;
  std::mutex mu;  // at_shutdown
  bool shut_down = false;
};
RegistryState& state() {
  static RegistryState* s = new RegistryState();
  return *s;
}

}  // namespace

const std::vector<BackendEntry>& backends() {
  static const bool loaded = (state().list = load_backends(), true);
  (void)loaded;
  return state().list;
}

void at_backend_shutdown(std::function<void()> close) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().at_shutdown.push_back(std::move(close));
}

void shutdown_backends() {
  RegistryState& s = state();
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    hooks.swap(s.at_shutdown);
  }
  for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) (*it)();
  if (s.shut_down) return;
  s.shut_down = true;
  for (auto it = s.list.rbegin(); it != s.list.rend(); ++it) {
    if (!it->backend) continue;
    const bool last = it->backend.use_count() == 1;
    it->backend.reset();
    trace_teardown("backend " + it->name + (last ? " destroyed" : " released (held elsewhere)"));
    it->error = "the backends were shut down (ct::shutdown_backends())";
  }
}

std::string available_devices() {
  std::string list;
  for (const auto& e : backends()) {
    if (!e.backend || !e.error.empty()) continue;
    for (const auto& d : e.backend->devices())
      list += (list.empty() ? "" : ", ") + d.id() + " (" + d.name + ")";
  }
  return list.empty() ? "none" : list;
}

// --backend auto's order of a device (lower first; -1: never), from what the device says of
// itself (DeviceInfo): discrete GPUs, then integrated ones, then the CPU; within a type the
// vendor's native stack before a portable API on the same hardware (CUDA or HIP before Vulkan);
// a CPU only through its native stack (the cpu backend, not lavapipe); never a test-only device
// (the SIMT runtime) or a virtual one. Ties go to the first listed (cpu:0 before cpu:1).
int auto_rank(const DeviceInfo& d) {
  if (d.test_only) return -1;
  const int portable = d.native_stack ? 0 : 1;
  switch (d.type) {
    case DeviceType::kDiscreteGpu:
      return 0 + portable;
    case DeviceType::kIntegratedGpu:
      return 2 + portable;
    case DeviceType::kCpu:
      return d.native_stack ? 4 : -1;
    default:
      return -1;
  }
}

std::string choose_auto_device(std::string* why) {
  struct Pick {
    int rank = 99;
    std::string spec, name;
  } best;
  std::string passed;
  for (const auto& e : backends()) {
    if (!e.backend || !e.error.empty()) {
      passed += "; " + e.name + ": " + e.error;
      continue;
    }
    for (const auto& d : e.backend->devices()) {
      const int rank = auto_rank(d);
      if (rank >= 0 && rank < best.rank) best = {rank, d.id(), d.name};
    }
  }
  if (best.spec.empty()) fail(ErrorKind::kInvalidArgument, "--backend auto: no usable device");
  if (why) *why = "--backend auto: " + best.spec + " (" + best.name + ")" + passed;
  return best.spec;
}

static std::unique_ptr<Device> open_device_spec(const std::string& spec);

std::unique_ptr<Device> open_device(const std::string& spec) {
  if (spec != "auto") return open_device_spec(spec);
  std::string why;
  std::string chosen = choose_auto_device(&why);
  std::fprintf(stderr, "%s\n", why.c_str());
  return open_device_spec(chosen);
}

std::unique_ptr<Device> open_device_with_env(
    const std::string& spec, std::initializer_list<std::pair<const char*, const char*>> env) {
  std::vector<std::pair<const char*, std::optional<std::string>>> saved;
  for (const auto& [name, value] : env) {
    const char* old = std::getenv(name);
    saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    setenv(name, value, 1);
  }
  auto restore = [&saved] {
    for (const auto& [name, old] : saved) {
      if (old)
        setenv(name, old->c_str(), 1);
      else
        unsetenv(name);
    }
  };
  try {
    std::unique_ptr<Device> d = open_device(spec);
    restore();
    return d;
  } catch (...) {
    restore();
    throw;
  }
}

static std::unique_ptr<Device> open_device_spec(const std::string& spec) {
  std::string name = spec;
  int index = 0;
  if (auto colon = spec.find(':'); colon != std::string::npos) {
    name = spec.substr(0, colon);
    std::string idx = spec.substr(colon + 1);
    char* end = nullptr;
    long v = std::strtol(idx.c_str(), &end, 10);
    if (idx.empty() || *end != '\0' || v < 0)
      fail(ErrorKind::kInvalidArgument,
           "--backend " + spec + ": device index '" + idx + "' is not a non-negative integer");
    index = static_cast<int>(v);
  }
  std::string known;
  for (const auto& e : backends()) {
    known += (known.empty() ? "" : ", ") + e.name;
    if (e.name != name) continue;
    if (!e.backend || !e.error.empty())
      fail(ErrorKind::kInvalidArgument, "--backend " + spec + ": backend '" + name +
                                            "' is unavailable: " + e.error +
                                            "; available: " + available_devices());
    auto devs = e.backend->devices();
    if (index >= static_cast<int>(devs.size())) {
      std::string list;
      for (const auto& d : devs) list += "\n  " + d.id() + "  " + d.name;
      fail(ErrorKind::kInvalidArgument,
           "--backend " + spec + ": device index " + std::to_string(index) + " out of range; " +
               name + " has " + std::to_string(devs.size()) + " device(s):" + list);
    }
    return e.backend->open(index);
  }
  fail(ErrorKind::kInvalidArgument, "--backend " + spec + ": unknown backend '" + name +
                                        "' (known: " + known +
                                        ", or auto); available: " + available_devices());
}

}  // namespace ct
