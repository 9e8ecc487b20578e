// VK_KHR_cooperative_matrix: what Debian 12's Vulkan headers (1.3.239) lack, what a device
// offers, and the one rule that decides whether the cooperative-matrix GEMM may run there.
//
// Compile-time and run-time gating agree by construction: the coopmat modules exist only when
// the build made them (CT_VK_COOPMAT, cmake's CT_VK_COOPMAT_BUILD); the device enables the
// extension and the features the modules declare (cooperativeMatrix, shaderFloat16,
// vulkanMemoryModel, maintenance4 for LocalSizeId, subgroup size control with full subgroups)
// only when coopmat_gate() says yes, and the GEMM dispatches them only after the start-up
// self-test (backends/vulkan/ops/matmul.cpp) passed.
#pragma once

#include <cstdint>
#include <string>

#include "backends/vulkan/loader.h"

#ifndef VK_KHR_cooperative_matrix
// From the Vulkan registry (VK_KHR_cooperative_matrix, extension 507, spec version 2).
#define CT_VK_DECLARE_COOPMAT 1
enum CtVkCoopmatConstants : int32_t {
  kVkStructPhysicalDeviceCoopmatFeaturesKHR = 1000506000,
  kVkStructCoopmatPropertiesKHR = 1000506001,
  kVkComponentFloat16KHR = 0,
  kVkComponentFloat32KHR = 1,
  kVkScopeSubgroupKHR = 3,
};
struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess;
};
struct VkCooperativeMatrixPropertiesKHR {
  VkStructureType sType;
  void* pNext;
  uint32_t MSize, NSize, KSize;
  int32_t AType, BType, CType, ResultType;  // VkComponentTypeKHR
  VkBool32 saturatingAccumulation;
  int32_t scope;  // VkScopeKHR
};
typedef VkResult(VKAPI_PTR* PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)(
    VkPhysicalDevice, uint32_t*, VkCooperativeMatrixPropertiesKHR*);
#else
enum CtVkCoopmatConstants : int32_t {
  kVkStructPhysicalDeviceCoopmatFeaturesKHR =
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR,
  kVkStructCoopmatPropertiesKHR = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR,
  kVkComponentFloat16KHR = VK_COMPONENT_TYPE_FLOAT16_KHR,
  kVkComponentFloat32KHR = VK_COMPONENT_TYPE_FLOAT32_KHR,
  kVkScopeSubgroupKHR = VK_SCOPE_SUBGROUP_KHR,
};
#endif

#include <vector>

namespace ct::vk {

// A fragment shape M x N x K of the coopmat GEMM: A is M x K, B K x N, the accumulator M x N.
struct CmShape {
  uint32_t m = 0, n = 0, k = 0;
  bool operator==(const CmShape&) const = default;
  std::string str() const;  // "16x16x16"
};

// The shape the GEMM uses among those a driver lists for f16 x f16 + f32 -> f32 at subgroup
// scope: 16x16x16 where listed (NVIDIA, AMD RDNA3 and CDNA), else the listed shape with each
// side 8, 16 or 32 and the most multiply-adds per fragment (Intel Arc lists 8x16x16); {} if none.
// The workgroup tiles (32 or 64 rows and columns a subgroup, k staged 32 deep) hold whole
// fragments of every such shape.
CmShape pick_coopmat_shape(const std::vector<CmShape>& listed);

// What a physical device offers for the coopmat GEMM (context.cpp fills it).
struct CoopmatCaps {
  bool extension = false;           // VK_KHR_cooperative_matrix listed
  bool feature = false;             // cooperativeMatrix
  std::vector<CmShape> f16_shapes;  // f16 x f16 + f32 -> f32 shapes at subgroup scope
  uint32_t configurations = 0;  // entries vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR lists
  bool vulkan13 = false;        // apiVersion >= 1.3 (the modules are SPIR-V 1.6)
  bool memory_model = false;    // vulkanMemoryModel
  bool maintenance4 = false;    // LocalSizeId
  bool full_subgroups = false;  // subgroupSizeControl + computeFullSubgroups, compute stage
  bool float16 = false;         // shaderFloat16
  bool storage16 = false;       // storageBuffer16BitAccess
  uint32_t subgroup_size =
      0;                   // the size the pipeline requires (VkPhysicalDeviceSubgroupProperties)
  uint32_t vendor = 0;     // PCI vendor id
  uint32_t driver_id = 0;  // VkDriverId
  std::string device_name;
};

// The static part of the decision: may the coopmat GEMM be tried on this device at all?
struct CoopmatGate {
  bool emulate = false;  // CROSSTRAIN_VK_COOPMAT=emulate: the emulated build stands in (tests)
  bool allowed = false;  // real coopmat modules may be enabled and self-tested
  CmShape shape;         // the fragment shape they are specialized to (pick_coopmat_shape)
  std::string why;       // one line for `crosstrain devices`
};

// `built`: this binary has the coopmat modules. `env`: CROSSTRAIN_VK_COOPMAT (null, "0"/"off"
// to disable, "emulate" to self-test the emulated build in their place, "force" to skip the
// allow/deny list). Allow/deny list: AMD's own Windows/Linux drivers (AMDVLK, proprietary)
// advertise the extension on RDNA1/RDNA2 GPUs, which have no matrix cores, so they are denied
// unless the device name says RDNA3 or later (Radeon RX 7000/9000 series, Radeon Pro W7000,
// Instinct); Intel's ANV is allowed, its early coopmat releases' regressions are left to the
// self-test; everything else is allowed and self-tested.
CoopmatGate coopmat_gate(const CoopmatCaps& caps, bool built, const char* env);

// What the self-test's verdict line says when the coopmat flash attention kernels passed their
// part (the line is cached: an opened device reads its attention verdict back from it).
inline constexpr const char* kFlashCmInUse = "flash attention on coopmat";
// ... when bf16 GEMMs passed theirs (bf16 tiles staged as f16 scaled per tile: the shader's
// header).
inline constexpr const char* kGemmBf16CmInUse = "bf16 products on coopmat";

// The cooperative-matrix flash attention kernels (shaders/flash_attention_coopmat.comp): which
// kernel, the 32-bit words of shared memory it declares for R block rows, KT streamed rows a step,
// head size HS and subgroups of `lanes` (the shader's W_* layout), and the tile a device takes.
enum FlashCmKernel { kFlashCmFwd = 0, kFlashCmBwdQ = 1, kFlashCmBwdKv = 2 };
uint64_t flash_cm_words(int kernel, uint64_t R, uint64_t KT, uint64_t HS, uint64_t lanes);
struct FlashCmPlan {
  bool ok = false;
  uint32_t nw = 0, frm = 0, kt = 0;  // subgroups, fragment rows a subgroup, streamed rows a step
  uint32_t rows = 0;                 // rows a block: nw * frm * fragment rows (16)
  std::string why;                   // why not, when !ok
};
// The largest tile of {4, 2, 1} subgroups of 16 rows and 64, 32 or 16 streamed rows whose shared
// memory fits `shared_bytes`, for head sizes 16..128 in steps of 16, fragment sides 8 or 16 and
// 16..64 lanes a subgroup (`lanes`; 32 in the emulated build); force_nw / force_kt (non-zero)
// pin the tile (tests). !ok with the reason otherwise.
FlashCmPlan plan_flash_cm(int kernel, const CmShape& frag, uint32_t lanes, uint32_t shared_bytes,
                          int64_t hs, uint32_t force_nw = 0, uint32_t force_kt = 0);
// CROSSTRAIN_VK_CM_FRAG's MxNxK (sides 8, 16 or 32, M*N a multiple of 32: the emulated builds'
// fragments); false if it is not one. Empty or null: 16x16x16.
bool parse_cm_frag(const char* text, CmShape* out);

}  // namespace ct::vk

namespace ct::vk {

// $XDG_CACHE_HOME (or ~/.cache)/crosstrain/<prefix><uuid in hex><suffix>: the per-driver files
// (pipeline cache, coopmat verdict); empty where no cache folder is known.
std::string cache_file_path(const std::string& prefix, const uint8_t* uuid,
                            const std::string& suffix);

// The self-test's verdict, cached per device, driver version, pipeline-cache UUID and build of
// the shaders in $XDG_CACHE_HOME (or ~/.cache)/crosstrain/vulkan-coopmat-<uuid>-<driver
// version>-<shaders, 16 hex digits>[-emulated].txt: one line, "1 <why>" or "0 <why>". Empty path
// where no cache folder is known. `shaders` is shader_fingerprint() (vk_device.cpp): a verdict
// on one build's modules is not taken for another's.
std::string coopmat_verdict_path(const uint8_t* pipeline_cache_uuid, uint32_t driver_version,
                                 uint64_t shaders, bool emulated);
// FNV-1a (64 bits) over the SPIR-V words of every shader module the plugin embeds.
uint64_t shader_fingerprint();
bool read_coopmat_verdict(const std::string& path, bool* ok, std::string* why);
void write_coopmat_verdict(const std::string& path, bool ok, const std::string& why);
// The `coopmat GEMM` line of a verdict: "in use: <why>" or "not used: <why>".
std::string coopmat_verdict_line(bool ok, const std::string& why);

}  // namespace ct::vk
