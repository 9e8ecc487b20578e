#include "backends/vulkan/vk_device.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/op_support.h"
#include "core/teardown_trace.h"

namespace ct::vk {

uint64_t shader_fingerprint() {
  static const uint64_t fp = [] {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const ShaderBinary& b : kShaderBinaries)
      for (size_t i = 0; i < b.words; ++i)
        for (int k = 0; k < 4; ++k) h = (h ^ ((b.code[i] >> (8 * k)) & 0xffu)) * 0x100000001b3ull;
    return h;
  }();
  return fp;
}

// ---------------------------------------------------------------------------------------------
// Buffers

VkBufferObj::VkBufferObj(VulkanDevice& dev, size_t size, MemCategory category, VkBuffer buffer,
                         const Allocation& alloc, bool tracked, VkDeviceAddress addr)
    : Buffer(dev, size, category),
      vdev_(dev),
      buffer_(buffer),
      alloc_(alloc),
      tracked_(tracked),
      addr_(addr) {}

VkBufferObj::~VkBufferObj() {
  vdev_.retire(buffer_, alloc_, category(), size(), tracked_);
}

// ---------------------------------------------------------------------------------------------
// Device creation

VulkanDevice::VulkanDevice(std::shared_ptr<Instance> instance, int index)
    : instance_(std::move(instance)), pd_(instance_->devices().at(index)), f_(instance_->fns()) {
  info_ = pd_.info;
  cm_gate_ = coopmat_gate_now(pd_);
  float prio = 1.0f;
  auto qi = vk_struct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qi.queueFamilyIndex = pd_.queue_family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &prio;
  auto f12 = vk_struct<VkPhysicalDeviceVulkan12Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  f12.storageBuffer8BitAccess = pd_.storage8;
  f12.shaderFloat16 = pd_.float16;
  f12.bufferDeviceAddress = pd_.bda;
  auto f11 = vk_struct<VkPhysicalDeviceVulkan11Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  f11.storageBuffer16BitAccess = pd_.storage16;
  f11.pNext = &f12;
  auto feats = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  feats.pNext = &f11;
  feats.features.shaderInt64 = pd_.int64;
  std::vector<const char*> exts;
  if (pd_.memory_budget) exts.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  // The coopmat modules' needs (coopmat.h), only where the gate lets them be tried.
  auto fcm = vk_struct<VkPhysicalDeviceCooperativeMatrixFeaturesKHR>(
      static_cast<VkStructureType>(kVkStructPhysicalDeviceCoopmatFeaturesKHR));
  auto f13 = vk_struct<VkPhysicalDeviceVulkan13Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES);
  if (pd_.subgroup_control) {  // the tiled GEMM may require a subgroup size (matmul_kind.h)
    f13.subgroupSizeControl = VK_TRUE;
    f13.computeFullSubgroups = pd_.full_subgroups ? VK_TRUE : VK_FALSE;  // flash's FA_PAIR
    f12.pNext = &f13;
  }
  if (cm_gate_.allowed) {
    exts.push_back("VK_KHR_cooperative_matrix");
    fcm.cooperativeMatrix = VK_TRUE;
    f13.maintenance4 = VK_TRUE;
    f13.subgroupSizeControl = VK_TRUE;
    f13.computeFullSubgroups = VK_TRUE;
    f13.pNext = &fcm;
    f12.vulkanMemoryModel = VK_TRUE;
    f12.pNext = &f13;
  }
  auto ci = vk_struct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  ci.pNext = &feats;
  ci.queueCreateInfoCount = 1;
  ci.pQueueCreateInfos = &qi;
  ci.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  ci.ppEnabledExtensionNames = exts.data();
  VK_CHECK(f_.vkCreateDevice(pd_.handle, &ci, nullptr, &device_));
  trace_teardown(info_.id() + " opened");
  load_device(f_, device_);
  f_.vkGetDeviceQueue(device_, pd_.queue_family, 0, &queue_);
  alloc_ = std::make_unique<Allocator>(f_, device_, pd_, *instance_);
  load_pipeline_cache();
  if (const char* v = std::getenv("CROSSTRAIN_VK_INJECT_DEVICE_LOST"); v && *v)
    inject_lost_at_ = std::strtoull(v, nullptr, 10);
  if (const char* v = std::getenv("CROSSTRAIN_VK_PROFILE"); v && *v && std::strcmp(v, "0") != 0)
    set_profiling(true);
  if (const char* v = std::getenv("CROSSTRAIN_VK_STRICT_MATH");
      v && *v && std::strcmp(v, "0") != 0) {
    strict_twin_.resize(kNumShaders);
    for (uint32_t i = 0; i < kNumShaders; ++i) {
      strict_twin_[i] = i;
      const std::string twin = std::string(kShaderBinaries[i].name) + "_strict";
      for (uint32_t j = 0; j < kNumShaders; ++j)
        if (twin == kShaderBinaries[j].name) strict_twin_[i] = j;
    }
  }
  coopmat_start();
}

void VulkanDevice::coopmat_start() {
  const CoopmatGate& g = cm_gate_;
  auto show = [&](const std::string& why) {
    cm_why_ = why;
    for (auto& [k, v] : info_.extra)
      if (k == "coopmat GEMM") v = why;
  };
  show(g.why);
  if (!g.allowed && !g.emulate) return;
  cm_emulated_ = g.emulate;
  const std::string path = coopmat_verdict_path(
      pd_.props.pipelineCacheUUID, pd_.props.driverVersion, shader_fingerprint(), cm_emulated_);
  bool ok = false;
  std::string why;
  if (read_coopmat_verdict(path, &ok, &why)) {
    why += " (cached: " + path + ")";
  } else {
    ok = coopmat_self_test(&why);
    write_coopmat_verdict(path, ok, why);
  }
  cm_ok_ = ok;
  cm_flash_ok_ = ok && why.find(kFlashCmInUse) != std::string::npos;
  cm_bf16_ok_ = ok && why.find(kGemmBf16CmInUse) != std::string::npos;
  show(coopmat_verdict_line(ok, why));
}

VulkanDevice::~VulkanDevice() {
  try {
    if (!lost_) synchronize();
  } catch (...) {  // a destructor must not throw; the device is going away anyway
  }
  f_.vkDeviceWaitIdle(device_);
  try {
    if (!lost_) recycle(true);
  } catch (...) {
  }
  downloads_.clear();  // landed by the wait above, or lost with the device; retires the staging
  if (capture_) destroy_graph(*capture_);
  for (auto& [id, g] : graphs_) destroy_graph(*g);
  for (auto& [serial, g] : released_graphs_) destroy_graph(*g);
  capture_.reset();
  graphs_.clear();
  released_graphs_.clear();
  for (auto& r : retired_) {
    f_.vkDestroyBuffer(device_, r.buffer, nullptr);
    alloc_->free(r.alloc);
  }
  retired_.clear();
  auto destroy_batch = [&](Batch& b) {
    for (auto p : b.dpools) f_.vkDestroyDescriptorPool(device_, p, nullptr);
    if (b.queries) f_.vkDestroyQueryPool(device_, b.queries, nullptr);
    f_.vkDestroyFence(device_, b.fence, nullptr);
    f_.vkDestroyCommandPool(device_, b.pool, nullptr);
  };
  if (cur_) destroy_batch(*cur_);
  for (auto& b : spare_) destroy_batch(*b);
  for (auto& b : inflight_) destroy_batch(*b);  // only after a lost device
  auto destroy_pipeline = [&](const Pipeline& p) {
    if (p.pipeline) f_.vkDestroyPipeline(device_, p.pipeline, nullptr);
    if (p.layout) f_.vkDestroyPipelineLayout(device_, p.layout, nullptr);
    if (p.dsl) f_.vkDestroyDescriptorSetLayout(device_, p.dsl, nullptr);
  };
  for (auto& p : pipelines_) destroy_pipeline(p);
  for (auto& [key, p] : spec_pipelines_) destroy_pipeline(p);
  save_pipeline_cache();
  if (cache_) f_.vkDestroyPipelineCache(device_, cache_, nullptr);
  alloc_.reset();
  f_.vkDestroyDevice(device_, nullptr);
  trace_teardown(info_.id() + " closed");
}

// The precision table (core/op_support.h: 16-bit storage through the H_F16 / H_BF16 shader
// variants, fp32 arithmetic) within the dtypes this device has, less what needs a feature it
// lacks.
bool VulkanDevice::supports(OpKind op, DType dtype) const {
  bool have = std::find(info_.dtypes.begin(), info_.dtypes.end(), dtype) != info_.dtypes.end();
  if (!have || !precision_table_allows(op, dtype)) return false;
  switch (op) {
    // the 16-bit attention runs the GEMM path, which reads through device addresses
    case OpKind::kAttention:
      return dtype == DType::f32 || pd_.bda;
    // ops/optimizers.cpp; 8-bit AdamW stores its indices as uint8_t (8-bit storage)
    case OpKind::kAdamW8bit:
      return dtype == DType::f32 && pd_.storage8;
    default:
      return true;
  }
}

// ---------------------------------------------------------------------------------------------
// Memory

std::shared_ptr<VkBufferObj> VulkanDevice::make_buffer(size_t bytes, MemCategory category,
                                                       bool staging) {
  auto bi = vk_struct<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bi.size = std::max<size_t>(bytes, 4);
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
             VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  if (pd_.bda) bi.usage |= VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  if (bytes > pd_.max_alloc) {  // report as OOM naming the limit, before the driver refuses
    VkMemoryRequirements req{bytes, 16, ~0u};
    alloc_->allocate(req, staging);
  }
  VkBuffer buf = VK_NULL_HANDLE;
  VK_CHECK(f_.vkCreateBuffer(device_, &bi, nullptr, &buf));
  VkMemoryRequirements req;
  f_.vkGetBufferMemoryRequirements(device_, buf, &req);
  Allocation a;
  try {
    a = alloc_->allocate(req, staging);
  } catch (...) {
    f_.vkDestroyBuffer(device_, buf, nullptr);
    throw;
  }
  VK_CHECK(f_.vkBindBufferMemory(device_, buf, a.memory, a.offset));
  if (a.mapped) a.mapped = static_cast<char*>(a.mapped) + a.offset;
  VkDeviceAddress addr = 0;
  if (pd_.bda) {
    auto ai = vk_struct<VkBufferDeviceAddressInfo>(VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO);
    ai.buffer = buf;
    addr = f_.vkGetBufferDeviceAddress(device_, &ai);
  }
  if (!staging) tracker_.on_alloc(category, bytes);
  return std::make_shared<VkBufferObj>(*this, bytes, category, buf, a, !staging, addr);
}

std::shared_ptr<Buffer> VulkanDevice::allocate(size_t bytes, MemCategory category) {
  try {
    return make_buffer(bytes, category, false);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kOutOfMemory) throw;
    // Memory retired by finished work may satisfy the request: wait once and retry.
    synchronize();
  }
  try {
    return make_buffer(bytes, category, false);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kOutOfMemory) throw;
    fail(ErrorKind::kOutOfMemory,
         std::string(e.what()) + " (a buffer of " + mem_category_name(category) + ")");
  }
}

void VulkanDevice::retire(VkBuffer buffer, const Allocation& alloc, MemCategory category,
                          size_t size, bool tracked) {
  if (tracked) tracker_.on_free(category, size);
  retired_.push_back({next_serial_, buffer, alloc});
}

Tensor VulkanDevice::workspace(const Shape& shape, DType dtype) {
  return empty(shape, dtype, MemCategory::kWorkspace);
}

static const VkBufferObj& vkbuf(const Tensor& t) {
  CT_REQUIRE(t.defined(), "Vulkan op given an undefined tensor");
  auto* b = dynamic_cast<const VkBufferObj*>(t.buffer.get());
  CT_REQUIRE(b, "tensor " + t.describe() + " is not on a Vulkan device");
  return *b;
}

void VulkanDevice::upload_kernel(const Tensor& dst, const void* host, size_t bytes) {
  refuse_in_capture("upload", "the host's bytes would be staged once, at capture, not at replay");
  const VkBufferObj& d = vkbuf(dst);
  auto staging = make_buffer(bytes, MemCategory::kWorkspace, true);
  std::memcpy(staging->allocation().mapped, host, bytes);
  VkBufferCopy region{0, dst.offset, bytes};
  VkCommandBuffer cb = cmd();
  Access acc{d.handle(), dst.offset, dst.offset + bytes,
             true};  // staging: written by the host only
  hazard(cb, &acc, 1);
  stamp_begin(cb, "upload");
  f_.vkCmdCopyBuffer(cb, staging->handle(), d.handle(), 1, &region);
  stamp_end(cb);
  ++n_copies_;
}

void VulkanDevice::download_kernel(void* host, const Tensor& src, size_t bytes) {
  refuse_in_capture("download", "a blocking read waits for work that is only being recorded");
  const VkBufferObj& s = vkbuf(src);
  if (s.allocation().coherent) {
    // Host-visible device memory (lavapipe, integrated GPUs): every batch ends with a barrier
    // to host reads, so after the wait the bytes are read in place -- no copy, no extra submit.
    synchronize();
    std::memcpy(host, static_cast<const char*>(s.allocation().mapped) + src.offset, bytes);
    return;
  }
  auto staging = make_buffer(bytes, MemCategory::kWorkspace, true);
  VkBufferCopy region{src.offset, 0, bytes};
  VkCommandBuffer cb = cmd();
  Access acc[2] = {{s.handle(), src.offset, src.offset + bytes, false},
                   {staging->handle(), 0, bytes, true}};
  hazard(cb, acc, 2);
  stamp_begin(cb, "download");
  f_.vkCmdCopyBuffer(cb, s.handle(), staging->handle(), 1, &region);
  stamp_end(cb);
  ++n_copies_;
  synchronize();
  std::memcpy(host, staging->allocation().mapped, bytes);
}

// ---------------------------------------------------------------------------------------------
// Events and asynchronous downloads

Event VulkanDevice::download_async_kernel(void* host, const Tensor& src, size_t bytes) {
  refuse_in_capture("download_async", "its copy into host memory is made when its batch is done");
  const VkBufferObj& s = vkbuf(src);
  // Always through a staging buffer, even where src is host-visible: ops enqueued after this
  // call may overwrite src before the host looks, and the copy must see the value at this point.
  auto staging = make_buffer(bytes, MemCategory::kWorkspace, true);
  VkBufferCopy region{src.offset, 0, bytes};
  VkCommandBuffer cb = cmd();
  Access acc[2] = {{s.handle(), src.offset, src.offset + bytes, false},
                   {staging->handle(), 0, bytes, true}};
  hazard(cb, acc, 2);
  stamp_begin(cb, "download_async");
  f_.vkCmdCopyBuffer(cb, s.handle(), staging->handle(), 1, &region);
  stamp_end(cb);
  ++n_copies_;
  const uint64_t serial = cur_->serial;
  downloads_.push_back({serial, std::move(staging), host, bytes});
  submit();  // the batch ends with a barrier to host reads; its fence completes the event
  return Event(this, serial);
}

Event VulkanDevice::record_event() {
  ensure_alive();
  refuse_in_capture("record_event", "the host would wait for or query an event of the graph");
  // The open batch if there is one (submitted by flush() or the first done()/wait()), else the
  // last submitted batch; 0 before any submission, which counts as complete.
  return Event(this, cur_ && cur_->open ? cur_->serial : next_serial_ - 1);
}

bool VulkanDevice::event_done(const Event& e) {
  CT_REQUIRE(e.device() == this, "event_done: the event belongs to another device");
  refuse_in_capture("event_done", "querying work that is only being recorded");
  if (e.serial() <= completed_serial_) return true;
  if (cur_ && cur_->open && cur_->serial <= e.serial())
    submit();  // recycles what has completed, too
  else
    recycle(false);
  return e.serial() <= completed_serial_;
}

void VulkanDevice::wait_event(const Event& e) {
  CT_REQUIRE(e.device() == this, "wait_event: the event belongs to another device");
  refuse_in_capture("wait_event", "waiting for work that is only being recorded");
  wait_serial(e.serial());
}

void VulkanDevice::wait_serial(uint64_t serial) {
  if (serial <= completed_serial_) return;
  ++host_waits_;
  if (cur_ && cur_->open && cur_->serial <= serial) submit();
  // Batches in submission order: a later fence signalling says nothing about an earlier one.
  for (auto& b : inflight_) {
    if (b->serial > serial) break;
    check(f_.vkWaitForFences(device_, 1, &b->fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  }
  recycle(false);
  check_validation("wait_event");
}

void VulkanDevice::land_downloads() {
  size_t n = 0;
  for (; n < downloads_.size() && downloads_[n].serial <= completed_serial_; ++n)
    std::memcpy(downloads_[n].host, downloads_[n].staging->allocation().mapped,
                downloads_[n].bytes);
  downloads_.erase(downloads_.begin(), downloads_.begin() + static_cast<std::ptrdiff_t>(n));
}

void VulkanDevice::copy_bytes(const Tensor& dst, const Tensor& src) {
  CT_REQUIRE(dst.nbytes() == src.nbytes(), "copy: byte sizes differ");
  const VkBufferObj& d = vkbuf(dst);
  const VkBufferObj& s = vkbuf(src);
  CT_REQUIRE(&d != &s || dst.offset + dst.nbytes() <= src.offset ||
                 src.offset + src.nbytes() <= dst.offset,
             "copy: source and destination overlap");
  VkBufferCopy region{src.offset, dst.offset, dst.nbytes()};
  keep_for_graph(dst);
  keep_for_graph(src);
  VkCommandBuffer cb = cmd();
  Access acc[2] = {{s.handle(), src.offset, src.offset + src.nbytes(), false},
                   {d.handle(), dst.offset, dst.offset + dst.nbytes(), true}};
  hazard(cb, acc, 2);
  stamp_begin(cb, "copy");
  f_.vkCmdCopyBuffer(cb, s.handle(), d.handle(), 1, &region);
  stamp_end(cb);
  ++n_copies_;
}

// ---------------------------------------------------------------------------------------------
// Recording and submission

VkCommandBuffer VulkanDevice::cmd() {
  ensure_alive();
  if (capture_) return capture_->cmd;
  if (!cur_) {
    if (!spare_.empty()) {
      cur_ = std::move(spare_.back());
      spare_.pop_back();
    } else {
      cur_ = std::make_unique<Batch>();
      auto pi = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
      pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
      pi.queueFamilyIndex = pd_.queue_family;
      VK_CHECK(f_.vkCreateCommandPool(device_, &pi, nullptr, &cur_->pool));
      auto ai =
          vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
      ai.commandPool = cur_->pool;
      ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
      ai.commandBufferCount = 1;
      VK_CHECK(f_.vkAllocateCommandBuffers(device_, &ai, &cur_->cmd));
      auto fi = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
      VK_CHECK(f_.vkCreateFence(device_, &fi, nullptr, &cur_->fence));
    }
  }
  if (!cur_->open) {
    auto bi = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    VK_CHECK(f_.vkBeginCommandBuffer(cur_->cmd, &bi));
    cur_->open = true;
    cur_->serial = next_serial_;
    if (profiling_) {
      if (!cur_->queries) {
        auto qi = vk_struct<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
        qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
        qi.queryCount = kMaxStamps;
        VK_CHECK(f_.vkCreateQueryPool(device_, &qi, nullptr, &cur_->queries));
      }
      f_.vkCmdResetQueryPool(cur_->cmd, cur_->queries, 0, kMaxStamps);
      cur_->labels.clear();
    }
    // Work of earlier batches is ordered before this one's (submission order alone is not).
    if (!pending_.empty()) {
      barrier(cur_->cmd);
      pending_.clear();
    }
  }
  ++cur_->commands;
  return cur_->cmd;
}

// Simplest correct ordering: every command's writes are made visible to every later command
// (compute or transfer), and to the host for read-backs.
void VulkanDevice::barrier(VkCommandBuffer cb, bool to_host) {
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                     VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  VkPipelineStageFlags dst = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  if (to_host) {
    mb.dstAccessMask |= VK_ACCESS_HOST_READ_BIT;
    dst |= VK_PIPELINE_STAGE_HOST_BIT;
  }
  f_.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                          dst, 0, 1, &mb, 0, nullptr, 0, nullptr);
  ++n_barriers_;
}

void VulkanDevice::hazard(VkCommandBuffer cb, const Access* acc, size_t n) {
  bool conflict = false;
  for (size_t i = 0; i < n && !conflict; ++i)
    for (const Access& p : pending_)
      if (p.buffer == acc[i].buffer && p.lo < acc[i].hi && acc[i].lo < p.hi &&
          (p.write || acc[i].write)) {
        conflict = true;
        break;
      }
  if (conflict) {
    barrier(cb);
    pending_.clear();
  }
  pending_.insert(pending_.end(), acc, acc + n);
}

void VulkanDevice::stamp_begin(VkCommandBuffer cb, const char* label) {
  if (!profiling_ || capture_ || !cur_->queries || 2 * cur_->labels.size() + 2 > kMaxStamps) return;
  f_.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, cur_->queries,
                         static_cast<uint32_t>(2 * cur_->labels.size()));
  cur_->labels.push_back(label);
}

void VulkanDevice::stamp_end(VkCommandBuffer cb) {
  if (!profiling_ || capture_ || !cur_->queries || cur_->labels.empty()) return;
  uint32_t q = static_cast<uint32_t>(2 * cur_->labels.size() - 1);
  if (q >= kMaxStamps) return;
  f_.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, cur_->queries, q);
}

void VulkanDevice::collect_timestamps(Batch& b) {
  if (!b.queries || b.labels.empty()) return;
  std::vector<uint64_t> ts(2 * b.labels.size());
  check(f_.vkGetQueryPoolResults(device_, b.queries, 0, static_cast<uint32_t>(ts.size()),
                                 ts.size() * sizeof(uint64_t), ts.data(), sizeof(uint64_t),
                                 VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "vkGetQueryPoolResults");
  double period = pd_.props.limits.timestampPeriod;
  for (size_t i = 0; i < b.labels.size(); ++i) {
    OpTime& t = op_times_[b.labels[i]];
    ++t.count;
    if (ts[2 * i + 1] > ts[2 * i]) t.ns += static_cast<double>(ts[2 * i + 1] - ts[2 * i]) * period;
  }
  b.labels.clear();
}

void VulkanDevice::set_profiling(bool on) {
  CT_REQUIRE(!on || pd_.props.limits.timestampComputeAndGraphics,
             std::string("profiling: ") + pd_.props.deviceName + " has no compute timestamps");
  if (on && !profiling_) op_times_.clear();  // a new profile: times from now on
  profiling_ = on;
}

std::string VulkanDevice::profile_report() {
  synchronize();
  std::ostringstream o;
  char line[256];
  double total = 0;
  for (const auto& [name, t] : op_times_) total += t.ns;
  std::vector<std::pair<std::string, OpTime>> rows(op_times_.begin(), op_times_.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ns > b.second.ns; });
  o << "Vulkan profile (" << pd_.props.deviceName << "): GPU time per shader from timestamps\n";
  std::snprintf(line, sizeof line, "  %-26s %9s %12s %12s %7s\n", "op", "calls", "total ms",
                "mean us", "share");
  o << line;
  for (const auto& [name, t] : rows) {
    std::snprintf(line, sizeof line, "  %-26s %9llu %12.1f %12.1f %6.1f%%\n", name.c_str(),
                  static_cast<unsigned long long>(t.count), t.ns * 1e-6,
                  t.count ? t.ns * 1e-3 / static_cast<double>(t.count) : 0.0,
                  total > 0 ? 100.0 * t.ns / total : 0.0);
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-26s %9s %12.1f\n", "total", "", total * 1e-6);
  o << line;
  double fl = static_cast<double>(std::max<uint64_t>(n_flushes_, 1));
  std::snprintf(
      line, sizeof line,
      "  %llu dispatches, %llu copies, %llu barriers, %llu queue submits over %llu "
      "flushes (per flush: %.1f dispatches, %.1f barriers, %.2f submits)\n",
      static_cast<unsigned long long>(n_dispatches_), static_cast<unsigned long long>(n_copies_),
      static_cast<unsigned long long>(n_barriers_), static_cast<unsigned long long>(n_submits_),
      static_cast<unsigned long long>(n_flushes_), n_dispatches_ / fl, n_barriers_ / fl,
      n_submits_ / fl);
  o << line;
  return o.str();
}

void VulkanDevice::check(VkResult r, const char* call) {
  if (r == VK_SUCCESS) return;
  if (r == VK_ERROR_DEVICE_LOST) {
    lost_ = true;
    fail(ErrorKind::kDevice, std::string("Vulkan device lost: ") + call +
                                 " returned VK_ERROR_DEVICE_LOST on " + pd_.props.deviceName +
                                 "; no further work is submitted");
  }
  throw_vk_error(r, call, __FILE__, __LINE__);
}

void VulkanDevice::ensure_alive() const {
  if (lost_)
    fail(ErrorKind::kDevice, std::string("Vulkan device lost (") + pd_.props.deviceName +
                                 "): no further work is submitted");
}

void VulkanDevice::flush() {
  ++n_flushes_;  // the trainer flushes once per optimizer step
  submit();
}

void VulkanDevice::submit() {
  ensure_alive();
  if (cur_ && cur_->open) {
    barrier(cur_->cmd, true);  // everything written so far becomes visible to host reads
    VK_CHECK(f_.vkEndCommandBuffer(cur_->cmd));
    auto si = vk_struct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cur_->cmd;
    ++n_submits_;
    VkResult r = inject_lost_at_ && n_submits_ >= inject_lost_at_
                     ? VK_ERROR_DEVICE_LOST  // fault injection (tests)
                     : f_.vkQueueSubmit(queue_, 1, &si, cur_->fence);
    cur_->open = false;
    if (r != VK_SUCCESS) {
      cur_->labels.clear();
      VK_CHECK(f_.vkResetCommandPool(device_, cur_->pool, 0));
      for (auto p : cur_->dpools) VK_CHECK(f_.vkResetDescriptorPool(device_, p, 0));
      cur_->dpool_cur = 0;
      check(r, "vkQueueSubmit");
    }
    inflight_.push_back(std::move(cur_));
    ++next_serial_;
  }
  recycle(false);
  check_validation("flush");
}

void VulkanDevice::synchronize() {
  refuse_in_capture("synchronize", "waiting for work that is only being recorded");
  ++host_waits_;
  submit();
  recycle(true);
  check_validation("synchronize");
}

void VulkanDevice::recycle(bool wait_all) {
  while (!inflight_.empty()) {
    Batch& b = *inflight_.front();
    if (wait_all) {
      check(f_.vkWaitForFences(device_, 1, &b.fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    } else {
      VkResult r = f_.vkGetFenceStatus(device_, b.fence);
      if (r == VK_NOT_READY) break;
      check(r, "vkGetFenceStatus");
    }
    completed_serial_ = b.serial;
    collect_timestamps(b);
    VK_CHECK(f_.vkResetFences(device_, 1, &b.fence));
    VK_CHECK(f_.vkResetCommandPool(device_, b.pool, 0));
    for (auto p : b.dpools) VK_CHECK(f_.vkResetDescriptorPool(device_, p, 0));
    b.dpool_cur = 0;
    b.commands = 0;
    spare_.push_back(std::move(inflight_.front()));
    inflight_.erase(inflight_.begin());
  }
  land_downloads();
  // Nothing recorded and nothing in flight: everything retired is free to go.
  bool idle = inflight_.empty() && !(cur_ && cur_->open);
  for (size_t i = 0; i < released_graphs_.size();) {
    if (idle || released_graphs_[i].first <= completed_serial_) {
      destroy_graph(*released_graphs_[i].second);
      released_graphs_.erase(released_graphs_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  size_t keep = 0;
  for (auto& r : retired_) {
    if (idle || r.serial <= completed_serial_) {
      f_.vkDestroyBuffer(device_, r.buffer, nullptr);
      alloc_->free(r.alloc);
    } else {
      retired_[keep++] = r;
    }
  }
  retired_.resize(keep);
}

void VulkanDevice::check_validation(const char* where) {
  uint64_t n = instance_->validation_messages();
  if (n > validation_seen_) {
    validation_seen_ = n;
    fail(ErrorKind::kDevice, std::string("Vulkan validation reported ") + std::to_string(n) +
                                 " message(s) by " + where +
                                 "; first: " + instance_->first_validation_message());
  }
}

VkDescriptorSet VulkanDevice::descriptor_set(VkDescriptorSetLayout dsl) {
  // A graph's sets come from its own pools: they stay valid until the graph is released.
  std::vector<VkDescriptorPool>& dpools = capture_ ? capture_->dpools : cur_->dpools;
  size_t& dpool_cur = capture_ ? capture_->dpool_cur : cur_->dpool_cur;
  for (;;) {
    if (dpool_cur == dpools.size()) {
      VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 4096};
      auto pi =
          vk_struct<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
      pi.maxSets = 1024;
      pi.poolSizeCount = 1;
      pi.pPoolSizes = &ps;
      VkDescriptorPool pool;
      VK_CHECK(f_.vkCreateDescriptorPool(device_, &pi, nullptr, &pool));
      dpools.push_back(pool);
    }
    auto ai =
        vk_struct<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    ai.descriptorPool = dpools[dpool_cur];
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &dsl;
    VkDescriptorSet set;
    VkResult r = f_.vkAllocateDescriptorSets(device_, &ai, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) VK_CHECK(r);
    ++dpool_cur;
  }
}

// ---------------------------------------------------------------------------------------------
// Graphs: a secondary command buffer recorded once (begin_capture .. end_capture) and executed
// by every replay inside the open batch.

void VulkanDevice::begin_capture() {
  ensure_alive();
  refuse_in_capture("begin_capture", "captures do not nest");
  auto g = std::make_unique<Graph>();
  auto pi = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pi.queueFamilyIndex = pd_.queue_family;
  VK_CHECK(f_.vkCreateCommandPool(device_, &pi, nullptr, &g->pool));
  auto ai = vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  ai.commandPool = g->pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_SECONDARY;
  ai.commandBufferCount = 1;
  VkResult r = f_.vkAllocateCommandBuffers(device_, &ai, &g->cmd);
  if (r != VK_SUCCESS) {
    f_.vkDestroyCommandPool(device_, g->pool, nullptr);
    check(r, "vkAllocateCommandBuffers");
  }
  auto inherit =
      vk_struct<VkCommandBufferInheritanceInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO);
  auto bi = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  // Replays of one graph may be in several batches in flight at once, or twice in one.
  bi.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;
  bi.pInheritanceInfo = &inherit;
  r = f_.vkBeginCommandBuffer(g->cmd, &bi);
  if (r != VK_SUCCESS) {
    f_.vkDestroyCommandPool(device_, g->pool, nullptr);
    check(r, "vkBeginCommandBuffer");
  }
  // The graph's hazards are its own: a replay is ordered against everything around it by the
  // barriers replay_graph() records on either side.
  outside_pending_.swap(pending_);
  pending_.clear();
  capture_ = std::move(g);
}

int64_t VulkanDevice::end_capture() {
  if (!capture_) fail(ErrorKind::kInvalidArgument, info_.id() + ": end_capture: no capture");
  std::unique_ptr<Graph> g = std::move(capture_);
  pending_.swap(outside_pending_);
  outside_pending_.clear();
  const VkResult r = f_.vkEndCommandBuffer(g->cmd);
  g->seen.clear();
  if (!g->refused.empty() || r != VK_SUCCESS) {
    const std::string refused = g->refused;
    destroy_graph(*g);  // never submitted
    if (!refused.empty())
      fail(ErrorKind::kInvalidArgument,
           info_.id() + ": the graph capture was invalidated by " + refused);
    check(r, "vkEndCommandBuffer");
  }
  const int64_t id = next_graph_++;
  graphs_[id] = std::move(g);
  return id;
}

void VulkanDevice::replay_graph(int64_t graph) {
  refuse_in_capture("replay_graph", "a graph is not recorded into another");
  auto it = graphs_.find(graph);
  if (it == graphs_.end())
    fail(ErrorKind::kInvalidArgument, info_.id() + ": replay_graph: no graph " +
                                          std::to_string(graph) + " (released, or never made)");
  const Graph& g = *it->second;
  VkCommandBuffer cb = cmd();
  if (!pending_.empty()) barrier(cb);  // what was recorded before, before the graph
  f_.vkCmdExecuteCommands(cb, 1, &g.cmd);
  barrier(cb);  // the graph's writes before whatever comes next
  pending_.clear();
  n_dispatches_ += g.dispatches;
  ++graph_replays_;
}

void VulkanDevice::release_graph(int64_t graph) {
  auto it = graphs_.find(graph);
  if (it == graphs_.end()) return;
  std::unique_ptr<Graph> g = std::move(it->second);
  graphs_.erase(it);
  // Its buffers are retired as any dropped buffer is (freed once the work recorded so far is
  // done); its command buffer and descriptor sets live until the last batch that may execute
  // it has completed.
  g->buffers.clear();
  const uint64_t last = cur_ && cur_->open ? cur_->serial : next_serial_ - 1;
  released_graphs_.emplace_back(last, std::move(g));
  recycle(false);
}

void VulkanDevice::keep_for_graph(const Tensor& t) const {
  // capture_ is the device's recording state, not the tensor's: keeping a buffer alive for the
  // graph changes nothing an op observes, so bind() stays const.
  if (!capture_ || !t.buffer) return;
  if (capture_->seen.insert(t.buffer.get()).second) capture_->buffers.push_back(t.buffer);
}

void VulkanDevice::refuse_in_capture(const char* call, const std::string& why) {
  if (!capture_) return;
  const std::string what = std::string(call) + " during a graph capture: " + why +
                           " (a Vulkan graph is one command buffer, recorded once and replayed "
                           "as it is; CUDA and HIP refuse the same calls on a capturing stream)";
  if (capture_->refused.empty()) capture_->refused = what;
  fail(ErrorKind::kInvalidArgument, info_.id() + ": " + what);
}

void VulkanDevice::destroy_graph(Graph& g) {
  g.buffers.clear();
  for (auto p : g.dpools) f_.vkDestroyDescriptorPool(device_, p, nullptr);
  g.dpools.clear();
  if (g.pool) f_.vkDestroyCommandPool(device_, g.pool, nullptr);  // frees its command buffer
  g.pool = VK_NULL_HANDLE;
  g.cmd = VK_NULL_HANDLE;
}

// ---------------------------------------------------------------------------------------------
// Pipelines

// CROSSTRAIN_VK_PIPELINE_TIMES=1: the time of each pipeline's first dispatch (submitted and
// waited for alone), on stderr. A driver with a cold shader cache compiles there: lavapipe takes
// seconds for the big GEMMs. For finding what a cold CI run spends its time on.
bool VulkanDevice::pipeline_times() {
  static const bool on = [] {
    const char* v = std::getenv("CROSSTRAIN_VK_PIPELINE_TIMES");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

VulkanDevice::Pipeline& VulkanDevice::pipeline(ShaderId id, const PipelineSpec* spec) {
  if (!spec) {
    Pipeline& p = pipelines_[static_cast<uint32_t>(id)];
    if (!p.pipeline) p = create_pipeline(id, nullptr);
    return p;
  }
  std::vector<uint32_t> key{static_cast<uint32_t>(id), spec->n, spec->required_subgroup,
                            spec->full_subgroups ? 1u : 0u};
  key.insert(key.end(), spec->v.begin(), spec->v.begin() + spec->n);
  auto it = spec_pipelines_.find(key);
  if (it == spec_pipelines_.end())
    it = spec_pipelines_.emplace(key, create_pipeline(id, spec)).first;
  return it->second;
}

VulkanDevice::Pipeline VulkanDevice::create_pipeline(ShaderId id, const PipelineSpec* spec) {
  Pipeline p;
  const ShaderBinary& sb = kShaderBinaries[static_cast<uint32_t>(id)];
  std::vector<VkDescriptorSetLayoutBinding> lb;
  for (uint32_t i = 0; i < 32; ++i) {
    if (!(sb.info.binding_mask & (1u << i))) continue;
    VkDescriptorSetLayoutBinding b{};
    b.binding = i;
    b.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b.descriptorCount = 1;
    b.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    lb.push_back(b);
  }
  auto di = vk_struct<VkDescriptorSetLayoutCreateInfo>(
      VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  di.bindingCount = static_cast<uint32_t>(lb.size());
  di.pBindings = lb.data();
  VK_CHECK(f_.vkCreateDescriptorSetLayout(device_, &di, nullptr, &p.dsl));
  VkPushConstantRange pr{VK_SHADER_STAGE_COMPUTE_BIT, 0, sb.info.push_size};
  auto li = vk_struct<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  li.setLayoutCount = 1;
  li.pSetLayouts = &p.dsl;
  li.pushConstantRangeCount = sb.info.push_size ? 1 : 0;
  li.pPushConstantRanges = &pr;
  VK_CHECK(f_.vkCreatePipelineLayout(device_, &li, nullptr, &p.layout));
  auto mi = vk_struct<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  mi.codeSize = sb.words * 4;
  mi.pCode = sb.code;
  VkShaderModule mod;
  VK_CHECK(f_.vkCreateShaderModule(device_, &mi, nullptr, &mod));
  auto ci = vk_struct<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mod;
  ci.stage.pName = "main";
  ci.layout = p.layout;
  std::array<VkSpecializationMapEntry, 12> entries{};
  VkSpecializationInfo si{};
  auto rs = vk_struct<VkPipelineShaderStageRequiredSubgroupSizeCreateInfo>(
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO);
  if (spec) {
    for (uint32_t i = 0; i < spec->n; ++i)
      entries[i] = {i, i * static_cast<uint32_t>(sizeof(uint32_t)), sizeof(uint32_t)};
    si = {spec->n, entries.data(), spec->n * sizeof(uint32_t), spec->v.data()};
    ci.stage.pSpecializationInfo = &si;
    if (spec->full_subgroups)
      ci.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
    if (spec->required_subgroup) {
      rs.requiredSubgroupSize = spec->required_subgroup;
      ci.stage.pNext = &rs;
    }
  }
  VkResult r = f_.vkCreateComputePipelines(device_, cache_, 1, &ci, nullptr, &p.pipeline);
  if (pipeline_times()) {
    // lavapipe compiles at the first dispatch, not here: dispatch_raw times that one
    p.what = sb.name;
    for (uint32_t i = 0; spec && i < spec->n; ++i)
      p.what += (i ? "," : " [") + std::to_string(spec->v[i]) + (i + 1 == spec->n ? "]" : "");
    if (spec && spec->required_subgroup) p.what += " sg" + std::to_string(spec->required_subgroup);
  }
  f_.vkDestroyShaderModule(device_, mod, nullptr);
  if (r != VK_SUCCESS)
    fail(ErrorKind::kDevice,
         std::string("vkCreateComputePipelines(") + sb.name + ") failed: " + result_name(r));
  return p;
}

std::string VulkanDevice::pipeline_cache_path() const {
  return cache_file_path("vulkan-pipeline-cache-", pd_.props.pipelineCacheUUID, ".bin");
}

void VulkanDevice::load_pipeline_cache() {
  std::vector<char> data;
  std::string path = pipeline_cache_path();
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (in) data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // The driver checks the header (vendor, device, cache UUID) and ignores stale data; check the
  // UUID here too so a file from another driver is never handed over.
  if (data.size() < 16 + VK_UUID_SIZE ||
      std::memcmp(data.data() + 16, pd_.props.pipelineCacheUUID, VK_UUID_SIZE) != 0)
    data.clear();
  auto ci = vk_struct<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
  ci.initialDataSize = data.size();
  ci.pInitialData = data.empty() ? nullptr : data.data();
  if (f_.vkCreatePipelineCache(device_, &ci, nullptr, &cache_) != VK_SUCCESS) {
    ci.initialDataSize = 0;
    ci.pInitialData = nullptr;
    VK_CHECK(f_.vkCreatePipelineCache(device_, &ci, nullptr, &cache_));
  }
}

void VulkanDevice::save_pipeline_cache() {
  std::string path = pipeline_cache_path();
  if (path.empty() || !cache_) return;
  size_t n = 0;
  if (f_.vkGetPipelineCacheData(device_, cache_, &n, nullptr) != VK_SUCCESS || n == 0) return;
  std::vector<char> data(n);
  if (f_.vkGetPipelineCacheData(device_, cache_, &n, data.data()) != VK_SUCCESS) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return;
    out.write(data.data(), static_cast<std::streamsize>(n));
  }
  std::filesystem::rename(tmp, path, ec);  // atomic replace; a failed save is harmless
  if (ec) std::filesystem::remove(tmp, ec);
}

// ---------------------------------------------------------------------------------------------
// Dispatch

int64_t VulkanDevice::max_elems(size_t esize) const {
  uint64_t range = pd_.props.limits.maxStorageBufferRange;
  uint64_t align = pd_.props.limits.minStorageBufferOffsetAlignment;
  uint64_t n = (range - align) / esize;
  n = std::min<uint64_t>(n, 1ull << 31);
  return static_cast<int64_t>(n & ~uint64_t(255));
}

Bound VulkanDevice::bind(const Tensor& t, int64_t start, int64_t count) const {
  const VkBufferObj& b = vkbuf(t);
  keep_for_graph(t);
  size_t es = dtype_size(t.dtype);
  uint64_t align = pd_.props.limits.minStorageBufferOffsetAlignment;
  uint64_t begin = t.offset + static_cast<uint64_t>(start) * es;
  uint64_t off = begin / align * align;
  uint64_t end = begin + static_cast<uint64_t>(std::max<int64_t>(count, 1)) * es;
  CT_REQUIRE(end <= std::max<uint64_t>(b.size(), 4),
             "tensor " + t.describe() + " reaches past the end of its buffer");
  Bound r;
  r.buffer = b.handle();
  r.offset = off;
  r.range = end - off;
  r.first = static_cast<uint32_t>((begin - off) / es);
  r.addr = b.address() ? b.address() + off : 0;
  CT_CHECK((begin - off) % es == 0, "tensor offset is not a multiple of its element size");
  if (r.range > pd_.props.limits.maxStorageBufferRange)
    fail(ErrorKind::kUnsupported, "binding " + std::to_string(r.range) + " bytes of " +
                                      t.describe() + " exceeds maxStorageBufferRange (" +
                                      std::to_string(pd_.props.limits.maxStorageBufferRange) +
                                      "); this op does not split such tensors");
  return r;
}

std::array<uint32_t, 2> VulkanDevice::grid(uint64_t n, uint32_t local) const {
  uint64_t groups = std::max<uint64_t>((n + local - 1) / local, 1);
  uint64_t gx = std::min<uint64_t>(groups, max_groups_x());
  uint64_t gy = (groups + gx - 1) / gx;
  CT_CHECK(gy <= pd_.props.limits.maxComputeWorkGroupCount[1], "dispatch too large");
  return {static_cast<uint32_t>(gx), static_cast<uint32_t>(gy)};
}

void VulkanDevice::dispatch_raw(ShaderId id, const PipelineSpec* spec, const Bound* b, size_t nb,
                                const void* push, size_t push_size, uint32_t gx, uint32_t gy,
                                uint32_t gz) {
  if (!strict_twin_.empty()) id = static_cast<ShaderId>(strict_twin_[static_cast<uint32_t>(id)]);
  const ShaderBinary& sb = kShaderBinaries[static_cast<uint32_t>(id)];
  CT_CHECK(push_size == sb.info.push_size,
           std::string("push constants for ") + sb.name + ": " + std::to_string(push_size) +
               " bytes given, the shader's block has " + std::to_string(sb.info.push_size));
  CT_CHECK(nb == sb.info.num_bindings, std::string("binding count for ") + sb.name);
  Pipeline& p = pipeline(id, spec);
  const bool timed = !p.what.empty() && !capture_;  // a capture cannot wait for the device
  if (timed) synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  timespec c0{};
  if (timed) clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  VkCommandBuffer cb = cmd();
  std::array<Access, 16> acc{};
  CT_CHECK(nb <= acc.size(), "too many bindings");
  {
    uint32_t k = 0;
    for (uint32_t i = 0; i < 32 && k < nb; ++i) {
      if (!(sb.info.binding_mask & (1u << i))) continue;
      acc[k] = {b[k].buffer, b[k].offset, b[k].offset + b[k].range,
                !(sb.info.readonly_mask & (1u << i))};
      ++k;
    }
  }
  hazard(cb, acc.data(), nb);
  VkDescriptorSet set = descriptor_set(p.dsl);
  std::array<VkDescriptorBufferInfo, 16> infos{};
  std::array<VkWriteDescriptorSet, 16> writes{};
  CT_CHECK(nb <= infos.size(), "too many bindings");
  uint32_t bi = 0;
  for (uint32_t i = 0; i < 32 && bi < nb; ++i) {
    if (!(sb.info.binding_mask & (1u << i))) continue;
    infos[bi] = {b[bi].buffer, b[bi].offset, b[bi].range};
    VkWriteDescriptorSet& w = writes[bi];
    w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    w.dstSet = set;
    w.dstBinding = i;
    w.descriptorCount = 1;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &infos[bi];
    ++bi;
  }
  f_.vkUpdateDescriptorSets(device_, static_cast<uint32_t>(nb), writes.data(), 0, nullptr);
  f_.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  f_.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, &set, 0, nullptr);
  if (push_size)
    f_.vkCmdPushConstants(cb, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                          static_cast<uint32_t>(push_size), push);
  stamp_begin(cb, sb.name);
  f_.vkCmdDispatch(cb, gx, gy, gz);
  stamp_end(cb);
  if (capture_)
    ++capture_->dispatches;  // counted when replayed
  else
    ++n_dispatches_;
  if (timed) {
    synchronize();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    timespec c1{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    const double cpu = (c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) * 1e-6;
    std::fprintf(stderr, "vk pipeline %s: first dispatch %.0f ms (cpu %.0f ms)\n", p.what.c_str(),
                 ms, cpu);
    p.what.clear();
  }
}

}  // namespace ct::vk
