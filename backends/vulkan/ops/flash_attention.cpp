// PLACEHOLDER for the helper: the fused attention shaders are not written yet.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {
void VulkanDevice::flash_attention_forward_kernel(const Tensor&, const Tensor&, const Tensor&,
                                                  int) {
  fail(ErrorKind::kUnsupported, "flash_attention_forward: not on Vulkan yet");
}
void VulkanDevice::flash_attention_backward_kernel(const Tensor&, const Tensor&, const Tensor&,
                                                   const Tensor&, const Tensor&, int) {
  fail(ErrorKind::kUnsupported, "flash_attention_backward: not on Vulkan yet");
}
}  // namespace ct::vk
