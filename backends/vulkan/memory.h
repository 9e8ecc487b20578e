// A sub-allocator over large VkDeviceMemory blocks: first fit with coalescing free lists,
// alignment from each buffer's VkMemoryRequirements, a dedicated allocation for anything
// bigger than a block, and out-of-memory errors that name the request, the free memory and
// the limit hit.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/vulkan/context.h"

namespace ct::vk {

struct Allocation {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  VkDeviceSize size = 0;
  void* mapped = nullptr;  // host address of offset 0 for host-visible memory, else null
  int block = -1;          // index into the allocator's blocks
  bool coherent = false;   // mapped and HOST_COHERENT: the host may read it after a fence wait
};

class Allocator {
 public:
  Allocator(const Functions& fns, VkDevice device, const PhysicalDevice& pd,
            const Instance& instance);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Memory for `req`: device-local (host_visible = false) or host-visible and coherent
  // (staging). Throws Error(kOutOfMemory).
  Allocation allocate(const VkMemoryRequirements& req, bool host_visible);
  void free(const Allocation& a);

  // Bytes in VkDeviceMemory blocks, and bytes handed out of them.
  uint64_t reserved_bytes() const;
  uint64_t used_bytes() const;

 private:
  struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    uint32_t type = 0;
    VkDeviceSize size = 0;
    void* mapped = nullptr;
    bool dedicated = false;
    std::map<VkDeviceSize, VkDeviceSize> free;  // offset -> size, coalesced
  };
  bool coherent(const Block& b) const;
  int find_type(uint32_t bits, bool host_visible) const;
  bool new_block(uint32_t type, VkDeviceSize size, bool dedicated, int* index);
  [[noreturn]] void out_of_memory(VkDeviceSize bytes, const char* limit) const;

  const Functions& f_;
  VkDevice device_;
  const PhysicalDevice& pd_;
  const Instance& instance_;
  VkDeviceSize block_size_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;  // freed dedicated/empty slots have memory == VK_NULL_HANDLE
  uint64_t reserved_ = 0, used_ = 0;
};

}  // namespace ct::vk
