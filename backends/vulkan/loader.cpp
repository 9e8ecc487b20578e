#include "backends/vulkan/loader.h"

#include <dlfcn.h>

#include "core/error.h"

namespace ct::vk {

bool load_global(Functions& f, std::string* why) {
  static void* handle = nullptr;
  if (!handle) handle = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle) handle = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    *why = std::string("no Vulkan loader (libvulkan.so.1): ") + (e ? e : "not found") +
           "; install libvulkan1 and a driver (mesa-vulkan-drivers for lavapipe)";
    return false;
  }
  f.vkGetInstanceProcAddr =
      reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(handle, "vkGetInstanceProcAddr"));
  if (!f.vkGetInstanceProcAddr) {
    *why = "the Vulkan loader does not export vkGetInstanceProcAddr";
    return false;
  }
#define CT_VK_LOAD_GLOBAL(name) \
  f.name = reinterpret_cast<PFN_##name>(f.vkGetInstanceProcAddr(nullptr, #name));
  CT_VK_GLOBAL_FUNCTIONS(CT_VK_LOAD_GLOBAL)
#undef CT_VK_LOAD_GLOBAL
  if (!f.vkCreateInstance || !f.vkEnumerateInstanceExtensionProperties) {
    *why = "the Vulkan loader lacks vkCreateInstance";
    return false;
  }
  return true;
}

void load_instance(Functions& f, VkInstance instance) {
#define CT_VK_LOAD_INSTANCE(name)                                                  \
  f.name = reinterpret_cast<PFN_##name>(f.vkGetInstanceProcAddr(instance, #name)); \
  if (!f.name) fail(ErrorKind::kDevice, "Vulkan instance lacks entry point " #name);
  CT_VK_INSTANCE_FUNCTIONS(CT_VK_LOAD_INSTANCE)
#undef CT_VK_LOAD_INSTANCE
#define CT_VK_LOAD_OPTIONAL(name) \
  f.name = reinterpret_cast<PFN_##name>(f.vkGetInstanceProcAddr(instance, #name));
  CT_VK_DEBUG_FUNCTIONS(CT_VK_LOAD_OPTIONAL)
#undef CT_VK_LOAD_OPTIONAL
}

void load_device(Functions& f, VkDevice device) {
#define CT_VK_LOAD_DEVICE(name)                                                \
  f.name = reinterpret_cast<PFN_##name>(f.vkGetDeviceProcAddr(device, #name)); \
  if (!f.name) fail(ErrorKind::kDevice, "Vulkan device lacks entry point " #name);
  CT_VK_DEVICE_FUNCTIONS(CT_VK_LOAD_DEVICE)
#undef CT_VK_LOAD_DEVICE
}

const char* result_name(VkResult r) {
  switch (r) {
#define CT_VK_CASE(x) \
  case x:             \
    return #x;
    CT_VK_CASE(VK_SUCCESS)
    CT_VK_CASE(VK_NOT_READY)
    CT_VK_CASE(VK_TIMEOUT)
    CT_VK_CASE(VK_INCOMPLETE)
    CT_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    CT_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    CT_VK_CASE(VK_ERROR_INITIALIZATION_FAILED)
    CT_VK_CASE(VK_ERROR_DEVICE_LOST)
    CT_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    CT_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    CT_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    CT_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    CT_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    CT_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    CT_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    CT_VK_CASE(VK_ERROR_FRAGMENTED_POOL)
    CT_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    CT_VK_CASE(VK_ERROR_UNKNOWN)
#undef CT_VK_CASE
    default:
      return "VkResult(?)";
  }
}

void throw_vk_error(VkResult r, const char* call, const char* file, int line) {
  bool oom = r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY;
  std::string what = std::string(call) + " failed: " + result_name(r) + " (" + file + ":" +
                     std::to_string(line) + ")";
  fail(oom ? ErrorKind::kOutOfMemory : ErrorKind::kDevice, what);
}

}  // namespace ct::vk
