#include "backends/vulkan/context.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/vulkan/matmul_kind.h"
#include "core/error.h"
#include "core/teardown_trace.h"

namespace ct::vk {

static const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

static bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

static VKAPI_ATTR VkBool32 VKAPI_CALL
debug_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
               const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  const char* sev =
      (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) ? "error" : "warning";
  std::fprintf(stderr, "[vulkan validation %s] %s\n", sev, data->pMessage ? data->pMessage : "");
  static_cast<Instance*>(user)->record_message(data->pMessage ? data->pMessage : "");
  return VK_FALSE;
}

void Instance::record_message(const char* text) {
  std::lock_guard<std::mutex> lock(msg_mu_);
  if (messages_.fetch_add(1) == 0) first_message_ = text;
}

std::string Instance::first_validation_message() const {
  std::lock_guard<std::mutex> lock(msg_mu_);
  return first_message_;
}

std::shared_ptr<Instance> Instance::create(std::string* why) {
  std::shared_ptr<Instance> inst(new Instance());
  if (!load_global(inst->fns_, why)) return nullptr;
  const Functions& f = inst->fns_;

  uint32_t api = VK_API_VERSION_1_0;
  if (f.vkEnumerateInstanceVersion) f.vkEnumerateInstanceVersion(&api);
  if (api < VK_API_VERSION_1_2) {
    *why = "the Vulkan loader supports only Vulkan " + std::to_string(VK_API_VERSION_MAJOR(api)) +
           "." + std::to_string(VK_API_VERSION_MINOR(api)) + "; crosstrain needs 1.2";
    return nullptr;
  }
  uint32_t n = 0;
  f.vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  f.vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data());
  auto has_ext = [&](const char* e) {
    for (auto& x : exts)
      if (std::strcmp(x.extensionName, e) == 0) return true;
    return false;
  };
  std::vector<const char*> enabled_exts, layers;
  bool validate = env_flag("CROSSTRAIN_VK_VALIDATION");
  if (has_ext(VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME))
    enabled_exts.push_back(VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME);
  if (validate) {
    uint32_t nl = 0;
    f.vkEnumerateInstanceLayerProperties(&nl, nullptr);
    std::vector<VkLayerProperties> lp(nl);
    f.vkEnumerateInstanceLayerProperties(&nl, lp.data());
    bool have_layer = false;
    for (auto& l : lp) have_layer |= std::strcmp(l.layerName, kValidationLayer) == 0;
    if (!have_layer) {
      *why =
          "CROSSTRAIN_VK_VALIDATION is set but VK_LAYER_KHRONOS_validation is not installed "
          "(Debian: vulkan-validationlayers)";
      return nullptr;
    }
    layers.push_back(kValidationLayer);
    // The layer's own extension list includes debug utils even if the loader's does not.
    enabled_exts.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    enabled_exts.push_back(VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME);  // the layer's, too
  }
  // With validation, synchronisation validation too: a missing barrier is a test failure.
  VkValidationFeatureEnableEXT enables[] = {
      VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  auto vf = vk_struct<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
  vf.enabledValidationFeatureCount = 1;
  vf.pEnabledValidationFeatures = enables;

  auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "crosstrain";
  app.pEngineName = "crosstrain";
  // 1.3 where the loader has it: the cooperative-matrix modules are SPIR-V 1.6 (Vulkan 1.3);
  // everything else needs 1.2.
  inst->api_ = api >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_2;
  app.apiVersion = inst->api_;
  auto ci = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ci.pApplicationInfo = &app;
  if (has_ext(VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME))
    ci.flags |= VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
  ci.enabledExtensionCount = static_cast<uint32_t>(enabled_exts.size());
  ci.ppEnabledExtensionNames = enabled_exts.data();
  ci.enabledLayerCount = static_cast<uint32_t>(layers.size());
  ci.ppEnabledLayerNames = layers.data();
  if (validate) ci.pNext = &vf;
  VkResult r = f.vkCreateInstance(&ci, nullptr, &inst->instance_);
  if (r != VK_SUCCESS) {
    *why = std::string("vkCreateInstance failed: ") + result_name(r) +
           (r == VK_ERROR_INCOMPATIBLE_DRIVER
                ? " (no Vulkan driver; install mesa-vulkan-drivers for lavapipe)"
                : "");
    return nullptr;
  }
  trace_teardown("vulkan instance created");
  try {
    load_instance(inst->fns_, inst->instance_);
    if (validate && inst->fns_.vkCreateDebugUtilsMessengerEXT) {
      auto mi = vk_struct<VkDebugUtilsMessengerCreateInfoEXT>(
          VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
      mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
      mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
      mi.pfnUserCallback = debug_callback;
      mi.pUserData = inst.get();
      VK_CHECK(inst->fns_.vkCreateDebugUtilsMessengerEXT(inst->instance_, &mi, nullptr,
                                                         &inst->messenger_));
    }
    inst->enumerate();
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
  if (inst->devices_.empty()) {
    *why =
        "no Vulkan device with a compute queue and Vulkan 1.2 was found (install "
        "mesa-vulkan-drivers for the lavapipe CPU device)";
    return nullptr;
  }
  return inst;
}

Instance::~Instance() {
  if (instance_ != VK_NULL_HANDLE) trace_teardown("vulkan instance destroyed");
  if (messenger_ != VK_NULL_HANDLE && fns_.vkDestroyDebugUtilsMessengerEXT)
    fns_.vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
  if (instance_ != VK_NULL_HANDLE) fns_.vkDestroyInstance(instance_, nullptr);
}

static DeviceType device_type(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return DeviceType::kCpu;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return DeviceType::kIntegratedGpu;
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return DeviceType::kDiscreteGpu;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return DeviceType::kVirtualGpu;
    default:
      return DeviceType::kOther;
  }
}

static std::string subgroup_ops(VkSubgroupFeatureFlags f) {
  static const std::pair<VkSubgroupFeatureFlagBits, const char*> names[] = {
      {VK_SUBGROUP_FEATURE_BASIC_BIT, "basic"},
      {VK_SUBGROUP_FEATURE_VOTE_BIT, "vote"},
      {VK_SUBGROUP_FEATURE_ARITHMETIC_BIT, "arithmetic"},
      {VK_SUBGROUP_FEATURE_BALLOT_BIT, "ballot"},
      {VK_SUBGROUP_FEATURE_SHUFFLE_BIT, "shuffle"},
      {VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT, "shuffle-relative"},
      {VK_SUBGROUP_FEATURE_CLUSTERED_BIT, "clustered"},
      {VK_SUBGROUP_FEATURE_QUAD_BIT, "quad"}};
  std::string s;
  for (auto& [bit, name] : names)
    if (f & bit) s += (s.empty() ? "" : ",") + std::string(name);
  return s.empty() ? "none" : s;
}

static std::string mib(uint64_t b) {
  return std::to_string(b >> 20) + " MiB";
}

// What the cooperative-matrix GEMM needs from this device (coopmat.h), and the gate's verdict.
void Instance::fill_coopmat_caps(PhysicalDevice& pd, const VkPhysicalDeviceVulkan12Features& f12,
                                 const VkPhysicalDeviceVulkan13Features& f13,
                                 const VkPhysicalDeviceCooperativeMatrixFeaturesKHR& fcm,
                                 const VkPhysicalDeviceVulkan12Properties& p12,
                                 const VkPhysicalDeviceVulkan13Properties& p13, bool v13) {
  CoopmatCaps& c = pd.cm;
  c.extension = pd.coopmat;
  c.feature = pd.coopmat && fcm.cooperativeMatrix;
  c.vulkan13 = v13;
  c.memory_model = f12.vulkanMemoryModel;
  c.maintenance4 = v13 && f13.maintenance4;
  c.full_subgroups = v13 && f13.subgroupSizeControl && f13.computeFullSubgroups &&
                     (p13.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                     pd.subgroup_size >= p13.minSubgroupSize &&
                     pd.subgroup_size <= p13.maxSubgroupSize;
  c.float16 = pd.float16;
  c.storage16 = pd.storage16;
  c.subgroup_size = pd.subgroup_size;
  c.vendor = pd.props.vendorID;
  c.driver_id = static_cast<uint32_t>(p12.driverID);
  c.device_name = pd.props.deviceName;
  if (c.feature) {
    auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR>(
        fns_.vkGetInstanceProcAddr(instance_, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
    uint32_t n = 0;
    if (get && get(pd.handle, &n, nullptr) == VK_SUCCESS && n > 0) {
      std::vector<VkCooperativeMatrixPropertiesKHR> cfg(
          n, vk_struct<VkCooperativeMatrixPropertiesKHR>(
                 static_cast<VkStructureType>(kVkStructCoopmatPropertiesKHR)));
      if (get(pd.handle, &n, cfg.data()) == VK_SUCCESS) {
        c.configurations = n;
        for (const auto& p : cfg)
          if (static_cast<int32_t>(p.AType) == kVkComponentFloat16KHR &&
              static_cast<int32_t>(p.BType) == kVkComponentFloat16KHR &&
              static_cast<int32_t>(p.CType) == kVkComponentFloat32KHR &&
              static_cast<int32_t>(p.ResultType) == kVkComponentFloat32KHR &&
              static_cast<int32_t>(p.scope) == kVkScopeSubgroupKHR && !p.saturatingAccumulation)
            c.f16_shapes.push_back({p.MSize, p.NSize, p.KSize});
      }
    }
  }
  pd.cm_gate = coopmat_gate_now(pd);
}

CoopmatGate coopmat_gate_now(const PhysicalDevice& pd) {
#if defined(CT_VK_COOPMAT)
  const bool built = true;
#else
  const bool built = false;
#endif
  return coopmat_gate(pd.cm, built, std::getenv("CROSSTRAIN_VK_COOPMAT"));
}

std::string coopmat_listing(const PhysicalDevice& pd, bool* settled) {
  *settled = true;
  const CoopmatGate g = coopmat_gate_now(pd);
  if (!g.allowed && !g.emulate) return g.why;
  const std::string path = coopmat_verdict_path(pd.props.pipelineCacheUUID, pd.props.driverVersion,
                                                shader_fingerprint(), g.emulate);
  bool ok = false;
  std::string why;
  if (read_coopmat_verdict(path, &ok, &why))
    return coopmat_verdict_line(ok, why) + " (cached: " + path + ")";
  *settled = false;
  return g.why + "; no verdict cached for this driver yet: the self-test runs when the device " +
         "is first opened (by any command that uses it, or `crosstrain devices`)";
}

void Instance::enumerate() {
  const Functions& f = fns_;
  uint32_t n = 0;
  VK_CHECK(f.vkEnumeratePhysicalDevices(instance_, &n, nullptr));
  std::vector<VkPhysicalDevice> pds(n);
  VK_CHECK(f.vkEnumeratePhysicalDevices(instance_, &n, pds.data()));
  for (VkPhysicalDevice h : pds) {
    PhysicalDevice pd;
    pd.handle = h;
    f.vkGetPhysicalDeviceProperties(h, &pd.props);
    if (pd.props.apiVersion < VK_API_VERSION_1_2) continue;
    uint32_t nq = 0;
    f.vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qf(nq);
    f.vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, qf.data());
    int family = -1;
    for (uint32_t i = 0; i < nq; ++i) {  // prefer a compute-only family (async compute)
      bool compute = qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT;
      bool graphics = qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT;
      if (compute && (family < 0 || !graphics)) family = static_cast<int>(i);
    }
    if (family < 0) continue;
    pd.queue_family = static_cast<uint32_t>(family);

    uint32_t ne = 0;
    f.vkEnumerateDeviceExtensionProperties(h, nullptr, &ne, nullptr);
    std::vector<VkExtensionProperties> exts(ne);
    f.vkEnumerateDeviceExtensionProperties(h, nullptr, &ne, exts.data());
    auto has_ext = [&](const char* e) {
      for (auto& x : exts)
        if (std::strcmp(x.extensionName, e) == 0) return true;
      return false;
    };
    pd.memory_budget = has_ext(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    pd.coopmat = has_ext("VK_KHR_cooperative_matrix");

    const bool v13 = pd.props.apiVersion >= VK_API_VERSION_1_3 && api_ >= VK_API_VERSION_1_3;
    auto fcm = vk_struct<VkPhysicalDeviceCooperativeMatrixFeaturesKHR>(
        static_cast<VkStructureType>(kVkStructPhysicalDeviceCoopmatFeaturesKHR));
    auto f13 = vk_struct<VkPhysicalDeviceVulkan13Features>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES);
    if (pd.coopmat) f13.pNext = &fcm;
    auto f12 = vk_struct<VkPhysicalDeviceVulkan12Features>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
    if (v13) f12.pNext = &f13;  // (a 1.2 device must not see 1.3 structs)
    auto f11 = vk_struct<VkPhysicalDeviceVulkan11Features>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
    f11.pNext = &f12;
    auto feats = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    feats.pNext = &f11;
    f.vkGetPhysicalDeviceFeatures2(h, &feats);
    pd.storage16 = f11.storageBuffer16BitAccess;
    pd.storage8 = f12.storageBuffer8BitAccess;
    pd.float16 = f12.shaderFloat16;
    pd.bda = f12.bufferDeviceAddress;
    pd.int64 = feats.features.shaderInt64;

    auto p13 = vk_struct<VkPhysicalDeviceVulkan13Properties>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_PROPERTIES);
    auto p12 = vk_struct<VkPhysicalDeviceVulkan12Properties>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES);
    if (v13) p12.pNext = &p13;
    auto p11 = vk_struct<VkPhysicalDeviceVulkan11Properties>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES);
    p11.pNext = &p12;
    auto props2 =
        vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    props2.pNext = &p11;
    f.vkGetPhysicalDeviceProperties2(h, &props2);
    pd.subgroup_size = p11.subgroupSize;
    pd.subgroup_ballot = (p11.subgroupSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                         (p11.subgroupSupportedOperations & VK_SUBGROUP_FEATURE_BALLOT_BIT);
    pd.subgroup_shuffle = (p11.subgroupSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                          (p11.subgroupSupportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
    pd.max_alloc = p11.maxMemoryAllocationSize;
    pd.subgroup_control = v13 && f13.subgroupSizeControl &&
                          (p13.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT);
    pd.full_subgroups = pd.subgroup_control && f13.computeFullSubgroups;
    pd.subgroup_min = v13 ? p13.minSubgroupSize : 0;
    pd.subgroup_max = v13 ? p13.maxSubgroupSize : 0;
    fill_coopmat_caps(pd, f12, f13, fcm, p12, p13, v13);

    f.vkGetPhysicalDeviceMemoryProperties(h, &pd.mem);
    uint64_t device_local = 0;
    std::string heaps;
    for (uint32_t i = 0; i < pd.mem.memoryHeapCount; ++i) {
      const VkMemoryHeap& hp = pd.mem.memoryHeaps[i];
      if (hp.flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) device_local += hp.size;
      heaps += (heaps.empty() ? "" : ", ") + mib(hp.size) +
               ((hp.flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) ? " device-local" : " host");
    }

    DeviceInfo& info = pd.info;
    info.backend = "vulkan";
    info.index = static_cast<int>(devices_.size());
    info.name = pd.props.deviceName;
    info.type = device_type(pd.props.deviceType);
    // --attention auto: on a Vulkan device that is the CPU (lavapipe) the GEMM-based unfused
    // path trained tiny at 4 x 256 3x faster than the fused one (570 vs 187 tokens/s, Mesa 25.0,
    // 2 cores): the fused shaders' per-row loops do not vectorise there. Fused on GPUs: it
    // saves the attention matrices.
    if (info.type == DeviceType::kCpu) info.preferred_attention = AttentionPath::kUnfused;
    info.driver = std::string(p12.driverName) + " " + p12.driverInfo;
    info.memory_bytes = static_cast<int64_t>(device_local);
    info.memory_budget_bytes = memory_budget(pd);
    info.max_allocation_bytes = static_cast<int64_t>(pd.max_alloc);
    info.max_buffer_range_bytes = pd.props.limits.maxStorageBufferRange;
    info.dtypes = {DType::f32, DType::i32};
    // A graph is a secondary command buffer recorded once and executed again (vk_device.h).
    info.graphs = true;
    if (pd.storage16) {
      info.dtypes.push_back(DType::f16);
      info.dtypes.push_back(DType::bf16);
    }
    if (pd.storage8) {
      info.dtypes.push_back(DType::i8);
      info.dtypes.push_back(DType::u8);
    }
    info.cooperative_matrix = pd.coopmat;
    info.fp16_arithmetic = pd.float16;
    info.bf16_arithmetic = false;
    uint32_t v = pd.props.apiVersion;
    auto yn = [](bool b) { return std::string(b ? "yes" : "no"); };
    info.extra = {
        {"api version", std::to_string(VK_API_VERSION_MAJOR(v)) + "." +
                            std::to_string(VK_API_VERSION_MINOR(v)) + "." +
                            std::to_string(VK_API_VERSION_PATCH(v))},
        {"memory heaps", heaps},
        {"memory budget", pd.memory_budget ? "VK_EXT_memory_budget" : "unknown"},
        {"maxStorageBufferRange", mib(pd.props.limits.maxStorageBufferRange)},
        {"maxMemoryAllocationSize", mib(pd.max_alloc)},
        {"minStorageBufferOffsetAlignment",
         std::to_string(pd.props.limits.minStorageBufferOffsetAlignment)},
        {"shaderFloat16", yn(pd.float16)},
        {"storageBuffer16BitAccess", yn(pd.storage16)},
        {"shaderInt64", yn(pd.int64)},
        {"storageBuffer8BitAccess", yn(pd.storage8)},
        {"subgroup size", std::to_string(p11.subgroupSize)},
        {"subgroup ops", subgroup_ops(p11.subgroupSupportedOperations)},
        {"cooperative matrix", yn(pd.coopmat)},
        {"coopmat GEMM", pd.cm_gate.why},
        {"max workgroup invocations",
         std::to_string(pd.props.limits.maxComputeWorkGroupInvocations)},
        {"shared memory", std::to_string(pd.props.limits.maxComputeSharedMemorySize) + " B"},
        {"matmul variant",
         describe(default_mm_kind(info.type == DeviceType::kCpu, pd.bda,
                                  pd.subgroup_size == 8 && pd.subgroup_ballot, pd.int64))},
    };
    devices_.push_back(std::move(pd));
  }
}

int64_t Instance::memory_budget(const PhysicalDevice& pd) const {
  if (!pd.memory_budget) return 0;
  auto budget = vk_struct<VkPhysicalDeviceMemoryBudgetPropertiesEXT>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT);
  auto mp = vk_struct<VkPhysicalDeviceMemoryProperties2>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2);
  mp.pNext = &budget;
  fns_.vkGetPhysicalDeviceMemoryProperties2(pd.handle, &mp);
  int64_t total = 0;
  for (uint32_t i = 0; i < mp.memoryProperties.memoryHeapCount; ++i)
    if (mp.memoryProperties.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      total += static_cast<int64_t>(budget.heapBudget[i] -
                                    std::min(budget.heapBudget[i], budget.heapUsage[i]));
  return total;
}

// The instance lives as long as the backend or a device uses it, never longer: the weak_ptr
// here does not keep it, so it is destroyed by shutdown_backends() (core/registry.h) or when the
// last device closes, and never by a static destructor during exit() (NVIDIA's driver has torn
// itself down by then, and vkDestroyInstance crashes). The state is leaked for the same reason.
namespace {
struct SharedInstance {
  std::mutex mu;
  std::weak_ptr<Instance> inst;
  std::string reason;  // why Vulkan is unusable; once set, not tried again
};
SharedInstance& shared_state() {
  static SharedInstance* s = new SharedInstance();
  return *s;
}
}  // namespace

std::shared_ptr<Instance> shared_instance(std::string* why) {
  SharedInstance& s = shared_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.reason.empty()) {
    *why = s.reason;
    return nullptr;
  }
  std::shared_ptr<Instance> inst = s.inst.lock();
  if (inst) return inst;
  inst = Instance::create(&s.reason);
  if (!inst) {
    if (s.reason.empty()) s.reason = "the Vulkan instance could not be created";
    *why = s.reason;
    return nullptr;
  }
  s.inst = inst;
  return inst;
}

std::shared_ptr<Instance> live_instance() {
  SharedInstance& s = shared_state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.inst.lock();
}

}  // namespace ct::vk
