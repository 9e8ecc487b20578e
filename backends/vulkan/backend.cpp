// The plugin's entry points: crosstrain_backend_abi_version and crosstrain_backend_create.
#include <memory>

#include "backends/vulkan/context.h"
#include "backends/vulkan/vk_device.h"
#include "core/error.h"

namespace ct::vk {
namespace {

class VulkanBackend final : public Backend {
 public:
  VulkanBackend() { instance_ = shared_instance(&why_); }
  std::string name() const override { return "vulkan"; }
  std::string unavailable_reason() const override { return instance_ ? "" : why_; }
  std::vector<DeviceInfo> devices() const override {
    std::vector<DeviceInfo> v;
    if (!instance_) return v;
    for (const auto& pd : instance_->devices()) {
      DeviceInfo info = pd.info;
      info.memory_budget_bytes = instance_->memory_budget(pd);
      bool settled = true;
      const std::string coopmat = coopmat_listing(pd, &settled);
      for (auto& [k, val] : info.extra)
        if (k == "coopmat GEMM") val = coopmat;
      info.settled_on_open = !settled;
      v.push_back(std::move(info));
    }
    return v;
  }
  std::unique_ptr<Device> open(int index) override {
    if (!instance_) fail(ErrorKind::kDevice, "Vulkan is unavailable: " + why_);
    int n = static_cast<int>(instance_->devices().size());
    if (index < 0 || index >= n) {
      std::string list;
      for (const auto& pd : instance_->devices())
        list += "\n  " + pd.info.id() + "  " + pd.info.name;
      fail(ErrorKind::kInvalidArgument, "vulkan:" + std::to_string(index) +
                                            " out of range; vulkan has " + std::to_string(n) +
                                            " device(s):" + list);
    }
    return std::make_unique<VulkanDevice>(instance_, index);
  }

 private:
  std::shared_ptr<Instance> instance_;
  std::string why_;
};

}  // namespace
}  // namespace ct::vk

extern "C" {
__attribute__((visibility("default"))) int crosstrain_backend_abi_version() {
  return ct::kBackendAbiVersion;
}
__attribute__((visibility("default"))) ct::Backend* crosstrain_backend_create() {
  return new ct::vk::VulkanBackend();
}
// Validation messages counted so far (CROSSTRAIN_VK_VALIDATION=1); tests fail on any.
__attribute__((visibility("default"))) uint64_t crosstrain_vk_validation_messages() {
  auto inst = ct::vk::live_instance();  // none after shutdown: nothing to count
  return inst ? inst->validation_messages() : 0;
}
}
