// Ops not yet implemented on Vulkan: supports() reports them false; calling one throws.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

[[noreturn]] static void pending(const char* op) {
  fail(ErrorKind::kUnsupported, std::string(op) + " is not implemented on the Vulkan backend yet");
}

void VulkanDevice::embedding_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { pending("embedding_forward"); }
void VulkanDevice::embedding_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { pending("embedding_backward"); }
void VulkanDevice::layernorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) { pending("layernorm_forward"); }
void VulkanDevice::layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { pending("layernorm_backward"); }
void VulkanDevice::matmul(const Tensor&, const Tensor&, const Tensor&, bool, bool, float, float, const Tensor*) { pending("matmul"); }
void VulkanDevice::bias_backward(const Tensor&, const Tensor&) { pending("bias_backward"); }
void VulkanDevice::attention_forward(const Tensor&, const Tensor&, const Tensor&, int) { pending("attention_forward"); }
void VulkanDevice::attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int) { pending("attention_backward"); }
void VulkanDevice::crossentropy_forward(const Tensor&, const Tensor&, const Tensor&) { pending("crossentropy_forward"); }
void VulkanDevice::crossentropy_backward(const Tensor&, const Tensor&, const Tensor&, float) { pending("crossentropy_backward"); }
void VulkanDevice::sum(const Tensor&, const Tensor&, float) { pending("sum"); }
void VulkanDevice::norm(const Tensor&, const Tensor&) { pending("norm"); }
void VulkanDevice::check_finite(const Tensor&, const Tensor&) { pending("check_finite"); }
void VulkanDevice::adamw(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWHyper&) { pending("adamw"); }

}  // namespace ct::vk
