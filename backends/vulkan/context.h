// The Vulkan instance, its physical devices and what they can do (Kompute's "Manager" half).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/vulkan/coopmat.h"
#include "backends/vulkan/loader.h"
#include "core/device.h"

namespace ct::vk {

// What this backend needs to know about one physical device beyond DeviceInfo.
struct PhysicalDevice {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  DeviceInfo info;
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties mem{};
  uint32_t queue_family = 0;   // a family with compute
  bool storage16 = false;      // storageBuffer16BitAccess
  bool storage8 = false;       // storageBuffer8BitAccess
  bool float16 = false;        // shaderFloat16
  bool memory_budget = false;  // VK_EXT_memory_budget
  bool coopmat = false;        // VK_KHR_cooperative_matrix
  bool bda = false;            // bufferDeviceAddress (matmul reads operands through it)
  bool int64 = false;          // shaderInt64 (MM_SG reads b as 64-bit pairs)
  uint32_t subgroup_size = 0;
  bool subgroup_ballot = false;   // subgroupBroadcast() in compute shaders
  bool subgroup_shuffle = false;  // subgroupShuffleXor() in compute shaders
  // subgroupSizeControl with compute in requiredSubgroupSizeStages, and the sizes allowed
  bool subgroup_control = false;
  uint32_t subgroup_min = 0, subgroup_max = 0;
  // computeFullSubgroups as well (enabled with subgroup_control): a pipeline may ask for its
  // workgroup in full subgroups (flash_attention.comp's FA_PAIR modules)
  bool full_subgroups = false;
  uint64_t max_alloc = 0;  // maxMemoryAllocationSize
  CoopmatCaps cm;          // what the cooperative-matrix GEMM needs (coopmat.h)
  CoopmatGate cm_gate;     // may it be tried here (CROSSTRAIN_VK_COOPMAT read at start)
};

// One VkInstance per process, shared by the backend and every device opened from it.
class Instance {
 public:
  // Loads Vulkan and creates the instance; null with *why set when Vulkan is unusable here.
  static std::shared_ptr<Instance> create(std::string* why);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  const Functions& fns() const { return fns_; }
  VkInstance handle() const { return instance_; }
  const std::vector<PhysicalDevice>& devices() const { return devices_; }
  // Memory budget (VK_EXT_memory_budget) of device-local heaps, or 0 where unknown.
  int64_t memory_budget(const PhysicalDevice& pd) const;

  // Validation (CROSSTRAIN_VK_VALIDATION=1): the Khronos layer plus a debug-utils messenger
  // that counts every warning/error it reports.
  bool validation() const { return messenger_ != VK_NULL_HANDLE; }
  uint64_t validation_messages() const { return messages_.load(); }
  std::string first_validation_message() const;
  void record_message(const char* text);

 private:
  Instance() = default;
  void enumerate();
  void fill_coopmat_caps(PhysicalDevice& pd, const VkPhysicalDeviceVulkan12Features& f12,
                         const VkPhysicalDeviceVulkan13Features& f13,
                         const VkPhysicalDeviceCooperativeMatrixFeaturesKHR& fcm,
                         const VkPhysicalDeviceVulkan12Properties& p12,
                         const VkPhysicalDeviceVulkan13Properties& p13, bool v13);

  Functions fns_;
  uint32_t api_ = VK_API_VERSION_1_2;  // the instance's apiVersion
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  std::vector<PhysicalDevice> devices_;
  std::atomic<uint64_t> messages_{0};
  mutable std::mutex msg_mu_;
  std::string first_message_;
};

// The coopmat gate of `pd` with CROSSTRAIN_VK_COOPMAT as it is now (devices opened later in a
// process may see another setting than the enumeration did).
CoopmatGate coopmat_gate_now(const PhysicalDevice& pd);
// The `coopmat GEMM` line of `pd` without opening it: the gate's line where that settles it, the
// cached verdict of the start-up self-test ("in use: ... (cached: <path>)"), or, where no verdict
// is cached for this driver yet, when the self-test will run, with *settled = false.
std::string coopmat_listing(const PhysicalDevice& pd, bool* settled);

// The process's instance, or null with *why: the one in use, or a new one where none is (the
// first call, or after the backend and every device let the last one go). Once creating it
// failed, every later call fails with the same reason.
std::shared_ptr<Instance> shared_instance(std::string* why);
// The instance in use, or null; never creates one.
std::shared_ptr<Instance> live_instance();

}  // namespace ct::vk
