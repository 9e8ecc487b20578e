// coopmat_gate(): the static half of the cooperative-matrix decision (see coopmat.h).
#include "backends/vulkan/coopmat.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace ct::vk {

namespace {

bool contains(const std::string& s, const char* what) {
  return s.find(what) != std::string::npos;
}

// AMD GPUs with matrix cores (WMMA or MFMA): RDNA3 and later, CDNA.
bool amd_has_matrix_cores(const std::string& name) {
  for (const char* n : {"RX 7", "RX 9", "PRO W7", "PRO W9", "Pro W7", "Pro W9", "Radeon 7",
                        "Radeon 8", "Instinct", "gfx11", "gfx12", "gfx90a", "gfx94"})
    if (contains(name, n)) return true;
  return false;
}

}  // namespace

std::string CmShape::str() const {
  return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

CmShape pick_coopmat_shape(const std::vector<CmShape>& listed) {
  auto side_ok = [](uint32_t v) { return v == 8 || v == 16 || v == 32; };
  CmShape best;
  for (const CmShape& s : listed) {
    if (!side_ok(s.m) || !side_ok(s.n) || !side_ok(s.k)) continue;
    if (s == CmShape{16, 16, 16}) return s;
    if (uint64_t(s.m) * s.n * s.k > uint64_t(best.m) * best.n * best.k) best = s;
  }
  return best;
}

CoopmatGate coopmat_gate(const CoopmatCaps& caps, bool built, const char* env) {
  CoopmatGate g;
  const std::string mode = env ? env : "";
  if (mode == "0" || mode == "off") {
    g.why = "off (CROSSTRAIN_VK_COOPMAT=" + mode + ")";
    return g;
  }
  if (mode == "emulate") {
    g.emulate = true;
    g.why = "emulated build under self-test (CROSSTRAIN_VK_COOPMAT=emulate)";
    return g;
  }
  auto no = [&](const std::string& why) {
    g.why = "not used: " + why;
    return g;
  };
  if (!built)
    return no("this build has no coopmat shaders (glslang without GL_KHR_cooperative_matrix)");
  if (!caps.extension) return no("the driver does not offer VK_KHR_cooperative_matrix");
  if (!caps.feature) return no("cooperativeMatrix feature not supported");
  const CmShape shape = pick_coopmat_shape(caps.f16_shapes);
  if (shape.m == 0)
    return no("no usable f16 x f16 -> f32 subgroup shape (sides 8, 16 or 32) among the driver's " +
              std::to_string(caps.configurations) + " configurations");
  if (!caps.vulkan13) return no("Vulkan 1.3 needed (the shaders are SPIR-V 1.6)");
  if (!caps.memory_model || !caps.maintenance4 || !caps.full_subgroups || !caps.float16 ||
      !caps.storage16)
    return no(std::string("missing ") + (!caps.memory_model   ? "vulkanMemoryModel"
                                         : !caps.maintenance4 ? "maintenance4"
                                         : !caps.full_subgroups
                                             ? "subgroup size control / computeFullSubgroups"
                                         : !caps.float16 ? "shaderFloat16"
                                                         : "storageBuffer16BitAccess"));
  if (caps.subgroup_size == 0 || caps.subgroup_size > 64) return no("unusual subgroup size");
  const bool amd_own_driver = caps.vendor == 0x1002 && (caps.driver_id == 1 || caps.driver_id == 2);
  if (amd_own_driver && !amd_has_matrix_cores(caps.device_name) && mode != "force")
    return no("denied: AMD's own driver on a GPU without matrix cores (advertised, emulated)");
  g.allowed = true;
  g.shape = shape;
  g.why = "candidate (" + shape.str() + " f16, subgroup " + std::to_string(caps.subgroup_size) +
          "), pending the start-up self-test";
  return g;
}

uint64_t flash_cm_words(int kernel, uint64_t R, uint64_t KT, uint64_t HS, uint64_t lanes) {
  const uint64_t ha = R * (HS + 8) / 2, hb = KT * (HS + 8) / 2, s = R * (KT + 4);
  const uint64_t p = R * (KT + 8) / 2;
  // The forward's row statistics: lanes / 16 invocations a row (a subgroup's 16 rows), their
  // partial maxima and sums (W_X, W_Y), and l and the rescale factor a row (W_L, W_AL).
  if (kernel == kFlashCmFwd) return ha + hb + s + p + 2 * R + 2 * R * (lanes / 16) + 4;
  if (kernel == kFlashCmBwdQ) return 2 * ha + 2 * hb + 2 * s + 2 * R + 4;  // P in dP's region
  return 2 * ha + 2 * hb + 2 * s + 2 * p + 2 * KT + 4;
}

FlashCmPlan plan_flash_cm(int kernel, const CmShape& frag, uint32_t lanes, uint32_t shared_bytes,
                          int64_t hs, uint32_t force_nw, uint32_t force_kt) {
  FlashCmPlan p;
  auto side = [](uint32_t v) { return v == 8 || v == 16; };
  if (hs % 16 != 0 || hs < 16 || hs > 128) {
    p.why =
        "head size " + std::to_string(hs) + " (the coopmat kernels take 16..128 in steps of 16)";
    return p;
  }
  if (!side(frag.m) || !side(frag.n) || !side(frag.k)) {
    p.why = "fragment shape " + frag.str() + " (the coopmat kernels take sides 8 and 16)";
    return p;
  }
  const uint32_t frm = 16 / frag.m;  // 16 rows a subgroup
  if (lanes < 16 || lanes > 64) {
    p.why = "subgroup size " + std::to_string(lanes) + " (the coopmat kernels need 16..64)";
    return p;
  }
  const uint32_t cand[][2] = {{4, 64}, {4, 32}, {2, 32}, {2, 16}, {1, 16}};
  for (const auto& c : cand) {
    const uint32_t nw = force_nw ? force_nw : c[0], kt = force_kt ? force_kt : c[1];
    const uint64_t words = flash_cm_words(kernel, uint64_t(nw) * 16, kt, uint64_t(hs), lanes);
    if (words * 4 <= shared_bytes) {
      p.ok = true, p.nw = nw, p.frm = frm, p.kt = kt, p.rows = nw * 16;
      return p;
    }
    if (force_nw || force_kt) break;
  }
  p.why = "its tiles exceed the device's " + std::to_string(shared_bytes) +
          " bytes of shared memory (head size " + std::to_string(hs) + ")";
  return p;
}

bool parse_cm_frag(const char* text, CmShape* out) {
  *out = {16, 16, 16};
  if (!text || !*text) return true;
  unsigned m = 0, n = 0, k = 0;
  char tail = 0;
  const bool parsed = std::sscanf(text, "%ux%ux%u%c", &m, &n, &k, &tail) == 3;
  *out = {m, n, k};
  return parsed && pick_coopmat_shape({*out}) == *out && (m * n) % 32 == 0;
}

std::string cache_file_path(const std::string& prefix, const uint8_t* uuid,
                            const std::string& suffix) {
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    base = x;
  else if (const char* h = std::getenv("HOME"); h && *h)
    base = std::string(h) + "/.cache";
  else
    return "";
  char hex[2 * VK_UUID_SIZE + 1];
  for (uint32_t i = 0; i < VK_UUID_SIZE; ++i) std::snprintf(hex + 2 * i, 3, "%02x", uuid[i]);
  return base + "/crosstrain/" + prefix + hex + suffix;
}

std::string coopmat_verdict_path(const uint8_t* uuid, uint32_t driver_version, uint64_t shaders,
                                 bool emulated) {
  // (appended step by step: GCC 12 warns falsely (-Wrestrict) on "-" + std::string)
  std::string suffix = "-";
  suffix += std::to_string(driver_version);
  char hex[18];
  std::snprintf(hex, sizeof hex, "-%016llx", static_cast<unsigned long long>(shaders));
  suffix += hex;
  if (emulated) suffix += "-emulated";
  suffix += ".txt";
  return cache_file_path("vulkan-coopmat-", uuid, suffix);
}

bool read_coopmat_verdict(const std::string& path, bool* ok, std::string* why) {
  if (path.empty()) return false;
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || line.size() < 3 || (line[0] != '0' && line[0] != '1') ||
      line[1] != ' ')
    return false;
  *ok = line[0] == '1';
  *why = line.substr(2);
  return true;
}

std::string coopmat_verdict_line(bool ok, const std::string& why) {
  return (ok ? "in use: " : "not used: ") + why;
}

void write_coopmat_verdict(const std::string& path, bool ok, const std::string& why) {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << (ok ? '1' : '0') << ' ' << why << "\n";
    if (!out) return;  // a cache: failing to write it costs a self-test next time, no more
  }
  std::filesystem::rename(tmp, path, ec);
}

}  // namespace ct::vk
