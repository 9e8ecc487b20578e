#include "backends/vulkan/memory.h"

#include <algorithm>

#include "core/error.h"

namespace ct::vk {

static VkDeviceSize align_up(VkDeviceSize v, VkDeviceSize a) {
  return (v + a - 1) / a * a;
}
static std::string mib(uint64_t b) {
  return std::to_string(b >> 20) + " MiB (" + std::to_string(b) + " bytes)";
}

Allocator::Allocator(const Functions& fns, VkDevice device, const PhysicalDevice& pd,
                     const Instance& instance)
    : f_(fns), device_(device), pd_(pd), instance_(instance) {
  block_size_ = std::min<VkDeviceSize>(256ull << 20, pd.max_alloc);
}

Allocator::~Allocator() {
  for (auto& b : blocks_)
    if (b.memory != VK_NULL_HANDLE) f_.vkFreeMemory(device_, b.memory, nullptr);
}

int Allocator::find_type(uint32_t bits, bool host_visible) const {
  VkMemoryPropertyFlags want =
      host_visible ? (VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
                   : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  int fallback = -1;
  for (uint32_t i = 0; i < pd_.mem.memoryTypeCount; ++i) {
    if (!(bits & (1u << i))) continue;
    VkMemoryPropertyFlags fl = pd_.mem.memoryTypes[i].propertyFlags;
    if ((fl & want) != want) continue;
    // Staging prefers cached memory (reads back fast); device memory prefers not host-visible
    // where both exist (discrete GPUs' BAR memory is small).
    if (host_visible && (fl & VK_MEMORY_PROPERTY_HOST_CACHED_BIT)) return static_cast<int>(i);
    if (!host_visible && !(fl & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) return static_cast<int>(i);
    if (fallback < 0) fallback = static_cast<int>(i);
  }
  return fallback;
}

void Allocator::out_of_memory(VkDeviceSize bytes, const char* limit) const {
  uint64_t heap = 0;
  for (uint32_t i = 0; i < pd_.mem.memoryHeapCount; ++i)
    if (pd_.mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      heap += pd_.mem.memoryHeaps[i].size;
  int64_t budget = instance_.memory_budget(pd_);
  uint64_t free_bytes = budget > 0
                            ? static_cast<uint64_t>(budget)
                            : (heap > reserved_ ? heap - reserved_ : 0) + (reserved_ - used_);
  fail(ErrorKind::kOutOfMemory, "Vulkan out of memory on " + std::string(pd_.props.deviceName) +
                                    ": requested " + mib(bytes) + ", free " + mib(free_bytes) +
                                    " (in use " + mib(used_) + "); limit hit: " + limit);
}

bool Allocator::new_block(uint32_t type, VkDeviceSize size, bool dedicated, int* index) {
  auto ai = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  ai.allocationSize = size;
  ai.memoryTypeIndex = type;
  auto fi = vk_struct<VkMemoryAllocateFlagsInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO);
  fi.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  if (pd_.bda) ai.pNext = &fi;  // buffers are created with SHADER_DEVICE_ADDRESS usage then
  VkDeviceMemory mem = VK_NULL_HANDLE;
  VkResult r = f_.vkAllocateMemory(device_, &ai, nullptr, &mem);
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) return false;
  VK_CHECK(r);
  Block b;
  b.memory = mem;
  b.type = type;
  b.size = size;
  b.dedicated = dedicated;
  b.free[0] = size;
  if (pd_.mem.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
    VK_CHECK(f_.vkMapMemory(device_, mem, 0, VK_WHOLE_SIZE, 0, &b.mapped));
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i].memory == VK_NULL_HANDLE) {
      blocks_[i] = std::move(b);
      *index = static_cast<int>(i);
      reserved_ += size;
      return true;
    }
  }
  blocks_.push_back(std::move(b));
  *index = static_cast<int>(blocks_.size() - 1);
  reserved_ += size;
  return true;
}

bool Allocator::coherent(const Block& b) const {
  return b.mapped &&
         (pd_.mem.memoryTypes[b.type].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
}

Allocation Allocator::allocate(const VkMemoryRequirements& req, bool host_visible) {
  std::lock_guard<std::mutex> lock(mu_);
  VkDeviceSize bytes = std::max<VkDeviceSize>(req.size, 1);
  if (bytes > pd_.max_alloc)
    out_of_memory(bytes, ("maxMemoryAllocationSize = " + mib(pd_.max_alloc)).c_str());
  int type = find_type(req.memoryTypeBits, host_visible);
  if (type < 0)
    fail(ErrorKind::kDevice, std::string("no Vulkan memory type for a ") +
                                 (host_visible ? "staging" : "device") + " buffer");
  VkDeviceSize align = std::max<VkDeviceSize>(req.alignment, 16);

  // first fit over existing blocks of this type
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& b = blocks_[i];
    if (b.memory == VK_NULL_HANDLE || b.dedicated || b.type != static_cast<uint32_t>(type))
      continue;
    for (auto it = b.free.begin(); it != b.free.end(); ++it) {
      VkDeviceSize start = align_up(it->first, align);
      VkDeviceSize end = it->first + it->second;
      if (start + bytes > end) continue;
      VkDeviceSize fo = it->first;
      b.free.erase(it);
      if (start > fo) b.free[fo] = start - fo;
      if (start + bytes < end) b.free[start + bytes] = end - (start + bytes);
      used_ += bytes;
      return {b.memory,
              start,
              bytes,
              b.mapped ? static_cast<char*>(b.mapped) : nullptr,
              static_cast<int>(i),
              coherent(b)};
    }
  }
  bool dedicated = bytes > block_size_ / 2;
  int bi = -1;
  if (!new_block(static_cast<uint32_t>(type), dedicated ? bytes : block_size_, dedicated, &bi)) {
    // A smaller block may still fit where a full one does not.
    if (dedicated || !new_block(static_cast<uint32_t>(type), align_up(bytes, 1 << 20), true, &bi))
      out_of_memory(bytes, "vkAllocateMemory returned VK_ERROR_OUT_OF_DEVICE_MEMORY");
    dedicated = true;
  }
  Block& b = blocks_[bi];
  b.free.clear();
  if (!dedicated && bytes < b.size) b.free[bytes] = b.size - bytes;
  used_ += bytes;
  return {b.memory, 0, bytes, b.mapped, bi, coherent(b)};
}

void Allocator::free(const Allocation& a) {
  if (a.block < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Block& b = blocks_[a.block];
  used_ -= a.size;
  if (b.dedicated) {
    f_.vkFreeMemory(device_, b.memory, nullptr);
    reserved_ -= b.size;
    b = Block{};
    return;
  }
  auto [it, ok] = b.free.emplace(a.offset, a.size);
  CT_CHECK(ok, "double free in the Vulkan allocator");
  auto next = std::next(it);
  if (next != b.free.end() && it->first + it->second == next->first) {
    it->second += next->second;
    b.free.erase(next);
  }
  if (it != b.free.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      b.free.erase(it);
    }
  }
  // Keep one empty block per type around; give the rest back.
  if (b.free.size() == 1 && b.free.begin()->second == b.size) {
    int empties = 0;
    for (auto& o : blocks_)
      if (o.memory != VK_NULL_HANDLE && !o.dedicated && o.type == b.type && o.free.size() == 1 &&
          o.free.begin()->second == o.size)
        ++empties;
    if (empties > 1) {
      f_.vkFreeMemory(device_, b.memory, nullptr);
      reserved_ -= b.size;
      b = Block{};
    }
  }
}

uint64_t Allocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}
uint64_t Allocator::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

}  // namespace ct::vk
