// vk_shader_stats: what a Vulkan driver's compiler makes of the project's shaders, without
// running them. For each SPIR-V module given it creates a compute pipeline (the specialization
// constants and required subgroup size the backend would use) with
// VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR and prints the driver's statistics
// (VK_KHR_pipeline_executable_properties): registers, spills, scratch, shared memory,
// instruction counts, as that driver reports them.
//
// Mesa's RADV compiles for an AMD GPU that is not there (RADV_FORCE_FAMILY: a "null hardware"
// device that creates pipelines but runs nothing), so this machine can see what ACO makes of a
// shader for RDNA2 (navi21), RDNA3 (navi31, with cooperative matrices), CDNA and others:
//
//   RADV_FORCE_FAMILY=navi31 VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/radeon_icd.json
//     build/bin/vk_shader_stats build/generated/vulkan/spv/flash_fwd_bf16.spv:spec=64 ...
//
// Arguments: MODULE.spv[:spec=v0,v1,...][:sg=N][:full] ...; spec: the values of specialization
// constants 0, 1, ... (32-bit); sg: the required subgroup size (VK_EXT_subgroup_size_control);
// full: require full subgroups. --device SUBSTRING picks the device (default: the first).
// Every binding 0..15 of set 0 is declared a storage buffer and 128 bytes of push constants (the
// backend's shaders use nothing else). Exit status 1 if a pipeline fails.
#include <vulkan/vulkan.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

// VK_KHR_cooperative_matrix's feature struct (the registry's layout; Debian 12's headers,
// 1.3.239, predate the extension).
struct CoopmatFeatures {
  VkStructureType sType = static_cast<VkStructureType>(1000506000);
  void* pNext = nullptr;
  VkBool32 cooperativeMatrix = VK_FALSE;
  VkBool32 cooperativeMatrixRobustBufferAccess = VK_FALSE;
};

// A Vulkan struct zeroed, with its sType.
template <typename T>
T vs(VkStructureType type) {
  T v{};
  v.sType = type;
  return v;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "vk_shader_stats: %s\n", what.c_str());
  std::exit(2);
}

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) die(std::string(what) + " failed: VkResult " + std::to_string(r));
}

struct Module {
  std::string path;
  std::vector<uint32_t> spec;
  uint32_t subgroup = 0;
  bool full = false;
};

Module parse(const std::string& arg) {
  Module m;
  size_t colon = arg.find(':');
  m.path = arg.substr(0, colon);
  while (colon != std::string::npos) {
    const size_t next = arg.find(':', colon + 1);
    const std::string opt =
        arg.substr(colon + 1, next == std::string::npos ? next : next - colon - 1);
    if (opt.rfind("spec=", 0) == 0) {
      for (size_t p = 5; p < opt.size();) {
        const size_t c = opt.find(',', p);
        m.spec.push_back(static_cast<uint32_t>(std::stoul(opt.substr(p, c - p))));
        p = c == std::string::npos ? opt.size() : c + 1;
      }
    } else if (opt.rfind("sg=", 0) == 0) {
      m.subgroup = static_cast<uint32_t>(std::stoul(opt.substr(3)));
    } else if (opt == "full") {
      m.full = true;
    } else {
      die("unknown option '" + opt + "' in " + arg + " (spec=a,b,..., sg=N, full)");
    }
    colon = next;
  }
  return m;
}

std::vector<uint32_t> read_spv(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) die(path + ": cannot open");
  const std::streamsize n = f.tellg();
  if (n <= 0 || n % 4 != 0) die(path + ": not a SPIR-V module (size " + std::to_string(n) + ")");
  std::vector<uint32_t> words(static_cast<size_t>(n) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(words.data()), n);
  if (words[0] != 0x07230203u) die(path + ": not a SPIR-V module (magic)");
  return words;
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, name) == 0) return true;
  return false;
}

std::string stat_value(const VkPipelineExecutableStatisticKHR& s) {
  char buf[64];
  switch (s.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
      return s.value.b32 ? "true" : "false";
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
      std::snprintf(buf, sizeof buf, "%" PRId64, s.value.i64);
      return buf;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
      std::snprintf(buf, sizeof buf, "%" PRIu64, s.value.u64);
      return buf;
    default:
      std::snprintf(buf, sizeof buf, "%g", s.value.f64);
      return buf;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string want;
  std::vector<Module> modules;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      want = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: vk_shader_stats [--device SUBSTRING] MODULE.spv[:spec=a,b,...][:sg=N]"
          "[:full] ...\n");
      return 0;
    } else {
      modules.push_back(parse(a));
    }
  }
  if (modules.empty()) die("no SPIR-V module given (--help)");

  auto app = vs<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "vk_shader_stats";
  app.apiVersion = VK_API_VERSION_1_3;
  auto ici = vs<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ici.pApplicationInfo = &app;
  VkInstance instance;
  check(vkCreateInstance(&ici, nullptr, &instance), "vkCreateInstance");
  uint32_t n = 0;
  vkEnumeratePhysicalDevices(instance, &n, nullptr);
  std::vector<VkPhysicalDevice> pds(n);
  vkEnumeratePhysicalDevices(instance, &n, pds.data());
  VkPhysicalDevice pd = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props{};
  for (VkPhysicalDevice d : pds) {
    vkGetPhysicalDeviceProperties(d, &props);
    if (want.empty() || std::strstr(props.deviceName, want.c_str())) {
      pd = d;
      break;
    }
  }
  if (!pd) die("no Vulkan device" + (want.empty() ? std::string() : " matching '" + want + "'"));

  uint32_t ne = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &ne, nullptr);
  std::vector<VkExtensionProperties> exts(ne);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &ne, exts.data());
  if (!has_extension(exts, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME))
    die(std::string(props.deviceName) + " lacks " +
        VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  const bool coopmat = has_extension(exts, "VK_KHR_cooperative_matrix");

  // Every feature the device has, as the backend's shaders may declare any of them, except the
  // robustness ones (which change the code the compiler makes; the backend leaves them off).
  auto pef = vs<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);
  CoopmatFeatures cmf;
  auto f13 =
      vs<VkPhysicalDeviceVulkan13Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES);
  auto f12 =
      vs<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  auto f11 =
      vs<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  auto f2 = vs<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  f2.pNext = &f11;
  f11.pNext = &f12;
  f12.pNext = &f13;
  f13.pNext = &pef;
  if (coopmat) pef.pNext = &cmf;
  vkGetPhysicalDeviceFeatures2(pd, &f2);
  f2.features.robustBufferAccess = VK_FALSE;
  cmf.cooperativeMatrixRobustBufferAccess = VK_FALSE;
  f13.robustImageAccess = VK_FALSE;
  if (!pef.pipelineExecutableInfo) die("pipelineExecutableInfo not supported");

  std::vector<const char*> names{VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME};
  if (coopmat) names.push_back("VK_KHR_cooperative_matrix");
  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf.data());
  uint32_t family = 0;
  while (family < nq && !(qf[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) ++family;
  if (family == nq) die("no compute queue");
  const float prio = 1.0f;
  auto qi = vs<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qi.queueFamilyIndex = family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &prio;
  auto dci = vs<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.pNext = &f2;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qi;
  dci.enabledExtensionCount = static_cast<uint32_t>(names.size());
  dci.ppEnabledExtensionNames = names.data();
  VkDevice device;
  check(vkCreateDevice(pd, &dci, nullptr, &device), "vkCreateDevice");
  auto get_props = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutablePropertiesKHR"));
  auto get_stats = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutableStatisticsKHR"));
  if (!get_props || !get_stats) die("no vkGetPipelineExecutable*KHR entry points");
  std::printf("# %s (driver %u.%u.%u, api %u.%u)\n", props.deviceName,
              VK_VERSION_MAJOR(props.driverVersion), VK_VERSION_MINOR(props.driverVersion),
              VK_VERSION_PATCH(props.driverVersion), VK_VERSION_MAJOR(props.apiVersion),
              VK_VERSION_MINOR(props.apiVersion));

  std::vector<VkDescriptorSetLayoutBinding> bindings(16);
  for (uint32_t b = 0; b < bindings.size(); ++b)
    bindings[b] = {b, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  auto dli =
      vs<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  dli.bindingCount = static_cast<uint32_t>(bindings.size());
  dli.pBindings = bindings.data();
  VkDescriptorSetLayout dsl;
  check(vkCreateDescriptorSetLayout(device, &dli, nullptr, &dsl), "vkCreateDescriptorSetLayout");
  const VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
  auto pli = vs<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  pli.setLayoutCount = 1;
  pli.pSetLayouts = &dsl;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &pcr;
  VkPipelineLayout layout;
  check(vkCreatePipelineLayout(device, &pli, nullptr, &layout), "vkCreatePipelineLayout");

  int failed = 0;
  for (const Module& m : modules) {
    const std::vector<uint32_t> words = read_spv(m.path);
    auto smi = vs<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
    smi.codeSize = words.size() * 4;
    smi.pCode = words.data();
    VkShaderModule mod;
    check(vkCreateShaderModule(device, &smi, nullptr, &mod), "vkCreateShaderModule");
    std::vector<VkSpecializationMapEntry> entries(m.spec.size());
    for (uint32_t i = 0; i < entries.size(); ++i) entries[i] = {i, 4 * i, 4};
    VkSpecializationInfo si{static_cast<uint32_t>(entries.size()), entries.data(),
                            m.spec.size() * 4, m.spec.data()};
    auto rs = vs<VkPipelineShaderStageRequiredSubgroupSizeCreateInfo>(
        VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO);
    rs.requiredSubgroupSize = m.subgroup;
    auto ci = vs<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
    ci.flags = VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
    ci.stage =
        vs<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = mod;
    ci.stage.pName = "main";
    if (!m.spec.empty()) ci.stage.pSpecializationInfo = &si;
    if (m.subgroup) ci.stage.pNext = &rs;
    if (m.full) ci.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
    ci.layout = layout;
    std::string label = m.path.substr(m.path.find_last_of('/') + 1);
    for (size_t i = 0; i < m.spec.size(); ++i)
      label += (i ? "," : " [") + std::to_string(m.spec[i]) + (i + 1 == m.spec.size() ? "]" : "");
    if (m.subgroup) label += " sg" + std::to_string(m.subgroup);
    VkPipeline pipeline;
    const VkResult r = vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &ci, nullptr, &pipeline);
    vkDestroyShaderModule(device, mod, nullptr);
    if (r != VK_SUCCESS) {
      std::printf("%s: vkCreateComputePipelines failed: VkResult %d\n", label.c_str(), r);
      ++failed;
      continue;
    }
    auto pinfo = vs<VkPipelineInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR);
    pinfo.pipeline = pipeline;
    uint32_t nexe = 0;
    get_props(device, &pinfo, &nexe, nullptr);
    for (uint32_t e = 0; e < nexe; ++e) {
      auto ei = vs<VkPipelineExecutableInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR);
      ei.pipeline = pipeline;
      ei.executableIndex = e;
      uint32_t ns = 0;
      get_stats(device, &ei, &ns, nullptr);
      std::vector<VkPipelineExecutableStatisticKHR> stats(
          ns, vs<VkPipelineExecutableStatisticKHR>(
                  VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR));
      get_stats(device, &ei, &ns, stats.data());
      std::string line = label + ":";
      for (const auto& s : stats) line += std::string(" ") + s.name + " " + stat_value(s) + ";";
      std::printf("%s\n", line.c_str());
    }
    vkDestroyPipeline(device, pipeline, nullptr);
  }
  vkDestroyPipelineLayout(device, layout, nullptr);
  vkDestroyDescriptorSetLayout(device, dsl, nullptr);
  vkDestroyDevice(device, nullptr);
  vkDestroyInstance(instance, nullptr);
  return failed ? 1 : 0;
}
