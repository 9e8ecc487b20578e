// Reaches Vulkan through the loader at run time: dlopen("libvulkan.so.1") and
// vkGetInstanceProcAddr, so crosstrain starts (and lists this backend as unavailable, with the
// reason) where no Vulkan loader is installed. VK_NO_PROTOTYPES: every entry point goes
// through a function table.
#pragma once

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>

#include <string>

namespace ct::vk {

#define CT_VK_GLOBAL_FUNCTIONS(X)           \
  X(vkCreateInstance)                       \
  X(vkEnumerateInstanceExtensionProperties) \
  X(vkEnumerateInstanceLayerProperties)     \
  X(vkEnumerateInstanceVersion)

#define CT_VK_INSTANCE_FUNCTIONS(X)           \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceFeatures2)             \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkGetPhysicalDeviceMemoryProperties2)     \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

#define CT_VK_DEBUG_FUNCTIONS(X)    \
  X(vkCreateDebugUtilsMessengerEXT) \
  X(vkDestroyDebugUtilsMessengerEXT)

#define CT_VK_DEVICE_FUNCTIONS(X)  \
  X(vkDestroyDevice)               \
  X(vkDeviceWaitIdle)              \
  X(vkGetDeviceQueue)              \
  X(vkCreateBuffer)                \
  X(vkDestroyBuffer)               \
  X(vkGetBufferMemoryRequirements) \
  X(vkAllocateMemory)              \
  X(vkFreeMemory)                  \
  X(vkBindBufferMemory)            \
  X(vkMapMemory)                   \
  X(vkUnmapMemory)                 \
  X(vkCreateCommandPool)           \
  X(vkDestroyCommandPool)          \
  X(vkResetCommandPool)            \
  X(vkAllocateCommandBuffers)      \
  X(vkBeginCommandBuffer)          \
  X(vkEndCommandBuffer)            \
  X(vkCmdExecuteCommands)          \
  X(vkCmdBindPipeline)             \
  X(vkCmdBindDescriptorSets)       \
  X(vkCmdPushConstants)            \
  X(vkCmdDispatch)                 \
  X(vkCmdPipelineBarrier)          \
  X(vkCmdCopyBuffer)               \
  X(vkCmdFillBuffer)               \
  X(vkQueueSubmit)                 \
  X(vkCreateFence)                 \
  X(vkDestroyFence)                \
  X(vkWaitForFences)               \
  X(vkResetFences)                 \
  X(vkGetFenceStatus)              \
  X(vkCreateDescriptorSetLayout)   \
  X(vkDestroyDescriptorSetLayout)  \
  X(vkCreatePipelineLayout)        \
  X(vkDestroyPipelineLayout)       \
  X(vkCreateComputePipelines)      \
  X(vkDestroyPipeline)             \
  X(vkCreateShaderModule)          \
  X(vkDestroyShaderModule)         \
  X(vkCreateDescriptorPool)        \
  X(vkDestroyDescriptorPool)       \
  X(vkResetDescriptorPool)         \
  X(vkAllocateDescriptorSets)      \
  X(vkUpdateDescriptorSets)        \
  X(vkCreatePipelineCache)         \
  X(vkDestroyPipelineCache)        \
  X(vkGetPipelineCacheData)        \
  X(vkGetBufferDeviceAddress)      \
  X(vkCreateQueryPool)             \
  X(vkDestroyQueryPool)            \
  X(vkCmdResetQueryPool)           \
  X(vkCmdWriteTimestamp)           \
  X(vkGetQueryPoolResults)

#define CT_VK_DECLARE_FN(name) PFN_##name name = nullptr;

// Every entry point crosstrain uses. Global and instance functions are filled by Loader and
// load_instance(); device functions by load_device().
struct Functions {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  CT_VK_GLOBAL_FUNCTIONS(CT_VK_DECLARE_FN)
  CT_VK_INSTANCE_FUNCTIONS(CT_VK_DECLARE_FN)
  CT_VK_DEBUG_FUNCTIONS(CT_VK_DECLARE_FN)
  CT_VK_DEVICE_FUNCTIONS(CT_VK_DECLARE_FN)
};

// Opens the Vulkan loader. Returns false and sets *why if it cannot be found or lacks
// vkGetInstanceProcAddr. The library stays loaded for the life of the process.
bool load_global(Functions& f, std::string* why);
// Instance-level entry points (throws Error(kDevice) naming a missing one). Debug-utils entry
// points are optional and stay null when the extension is off.
void load_instance(Functions& f, VkInstance instance);
void load_device(Functions& f, VkDevice device);

// A zeroed Vulkan create-info/properties struct with its sType set.
template <class T>
T vk_struct(VkStructureType type) {
  T v{};
  v.sType = type;
  return v;
}

// "VK_ERROR_OUT_OF_DEVICE_MEMORY", ...
const char* result_name(VkResult r);
// Throws Error(kDevice), or kOutOfMemory for the out-of-memory codes, naming the call.
[[noreturn]] void throw_vk_error(VkResult r, const char* call, const char* file, int line);

}  // namespace ct::vk

// VK_CHECK(call): a Vulkan call that must return VK_SUCCESS; the error names the call.
#define VK_CHECK(call)                                                                         \
  do {                                                                                         \
    VkResult ct_vk_r_ = (call);                                                                \
    if (ct_vk_r_ != VK_SUCCESS) ::ct::vk::throw_vk_error(ct_vk_r_, #call, __FILE__, __LINE__); \
  } while (0)
