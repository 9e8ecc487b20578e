// One opened Vulkan device: buffers, the command stream, pipelines and the op set. The ops are
// member functions defined one family per file under ops/.
#pragma once

#include <array>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "backends/vulkan/context.h"
#include "backends/vulkan/memory.h"
#include "core/device.h"
#include "shader_tables.h"

namespace ct::vk {

class VulkanDevice;

// A ct::Buffer backed by a VkBuffer over a sub-allocation. Destruction is deferred until the
// work recorded so far has finished with it.
class VkBufferObj final : public Buffer {
 public:
  VkBufferObj(VulkanDevice& dev, size_t size, MemCategory category, VkBuffer buffer,
              const Allocation& alloc, bool tracked, VkDeviceAddress addr);
  ~VkBufferObj() override;
  VkBuffer handle() const { return buffer_; }
  const Allocation& allocation() const { return alloc_; }
  VkDeviceAddress address() const { return addr_; }  // 0 without bufferDeviceAddress

 private:
  VulkanDevice& vdev_;
  VkBuffer buffer_;
  Allocation alloc_;
  bool tracked_;
  VkDeviceAddress addr_;
};

// A byte range of one VkBuffer bound to one descriptor, and the index (in elements of the
// tensor's type) of the first element the op asked for within that range.
struct Bound {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  VkDeviceSize range = 0;
  uint32_t first = 0;
  VkDeviceAddress addr = 0;  // device address of byte `offset` (0 without bufferDeviceAddress)
};

// Specialization of a compute pipeline: constants 0 .. n-1 (uint32 each, constant_id = index),
// and where required_subgroup != 0, that subgroup size (VK_EXT_subgroup_size_control / 1.3)
// with full subgroups when `full_subgroups`.
struct PipelineSpec {
  std::array<uint32_t, 12> v{};
  uint32_t n = 0;
  uint32_t required_subgroup = 0;
  bool full_subgroups = false;
};

// One strided batched GEMM for gemm(): c[z] = alpha op(a)[z] op(b)[z] + beta c[z] (+ bias).
// Strides are in elements, {batch, row, column} of op(a) [M,K], op(b) [K,N] and c [M,N]
// (c's column stride must be 1); `first` of each Bound is element (0,0,0).
struct GemmCall {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  Bound a, b, c, bias;
  std::array<int64_t, 3> sa{}, sb{}, sc{};
  bool has_bias = false;
  float alpha = 1.0f, beta = 0.0f;
  // operand dtypes (bias is f32): all f32, or a, b h with c f32 or h, or a f32 with b, c h
  DType ta = DType::f32, tb = DType::f32, tc = DType::f32;
  // The GELU epilogue (matmul.comp's push constant epi): kNone; kGeluForward: c = pre, ep (=)
  // gelu(pre); kGeluBackward: c (=) gelu'(ep) * the product. ep has c's dtype and strides (`first`
  // its element (0,0,0)).
  enum class Epilogue { kNone = 0, kGeluForward = 1, kGeluBackward = 2 } epi = Epilogue::kNone;
  Bound ep;
};

class VulkanDevice final : public Device {
 public:
  VulkanDevice(std::shared_ptr<Instance> instance, int index);
  ~VulkanDevice() override;

  const DeviceInfo& info() const override { return info_; }
  bool supports(OpKind op, DType dtype) const override;
  std::shared_ptr<Buffer> allocate(size_t bytes, MemCategory category) override;
  void flush() override;
  void synchronize() override;
  void set_profiling(bool on) override;
  std::string profile_report() override;
  // host_waits: synchronize() calls (each download is one) and waits for a batch not yet done;
  // graph_replays: replay_graph() calls.
  // gelu_epilogue:<path>: GEMM dispatches recorded with a GELU epilogue (matmul_bias_gelu,
  // matmul_gelu_backward), by path: vec, reg, tiled, coopmat, splitk (the split-k sum);
  // gelu_composed: those ops run as matmul + GELU shader instead (strict math, K = 0).
  std::map<std::string, int64_t> counters() override {
    std::map<std::string, int64_t> c = gelu_counts_;
    c["host_waits"] = host_waits_;
    c["graph_replays"] = graph_replays_;
    return c;
  }
  // Graphs (core/device.h's contract, the one CUDA's stream capture keeps): between
  // begin_capture() and end_capture() the ops are recorded into a secondary command buffer of
  // the graph's own, with descriptor sets from its own pools, and every buffer they bind is kept
  // by the graph until release_graph(); nothing runs. replay_graph() executes that command buffer
  // inside the open batch (vkCmdExecuteCommands) between two barriers: the host records and
  // binds nothing per op again. During a capture the calls that would copy host memory or wait
  // for the device throw, naming the call, and invalidate the capture.
  void begin_capture() override;
  int64_t end_capture() override;
  void replay_graph(int64_t graph) override;
  void release_graph(int64_t graph) override;
  // Events are batch serials: an event is complete when the fence of the batch holding it has
  // signalled. download_async records a copy into a staging buffer and submits; the memcpy into
  // host memory is done when the batch is seen complete (recycle()).
  Event record_event() override;
  bool event_done(const Event& e) override;
  void wait_event(const Event& e) override;
  void* native_stream() override { return reinterpret_cast<void*>(queue_); }

  // -- for the op files ------------------------------------------------------------------------
  // Elements [start, start+count) of t (contiguous), bound at an offset the device accepts;
  // throws if the range exceeds maxStorageBufferRange (split the op first: see max_elems()).
  Bound bind(const Tensor& t, int64_t start, int64_t count) const;
  Bound bind(const Tensor& t) const { return bind(t, 0, t.numel()); }
  // The most elements of `esize` bytes that one binding can always cover.
  int64_t max_elems(size_t esize) const;
  // Records one dispatch of `id` with its bindings (in binding order) and push constants. A
  // barrier is recorded before it only when it touches a byte range that a command since the
  // last barrier wrote, or writes one that such a command read (bindings the shader declares
  // readonly count as reads, all others as writes).
  template <class Push>
  void dispatch(ShaderId id, std::initializer_list<Bound> bindings, const Push& push, uint32_t gx,
                uint32_t gy = 1, uint32_t gz = 1) {
    dispatch_raw(id, nullptr, bindings.begin(), bindings.size(), &push, sizeof(Push), gx, gy, gz);
  }
  // The same for a module specialized by `spec` (one pipeline per distinct spec; null: none).
  template <class Push>
  void dispatch(ShaderId id, const PipelineSpec* spec, std::initializer_list<Bound> bindings,
                const Push& push, uint32_t gx, uint32_t gy = 1, uint32_t gz = 1) {
    dispatch_raw(id, spec, bindings.begin(), bindings.size(), &push, sizeof(Push), gx, gy, gz);
  }
  // Records one GEMM (ops/matmul.cpp); every binding must already fit (no splitting here).
  void gemm(const GemmCall& g);
  // The column sums of the bias, LayerNorm and RMSNorm weight gradients go in two passes: partial
  // sums of kColumnRows rows (workgroup z of the first pass's shader), then dst[n] += the
  // partials partial[k N + n], k = 0 .. chunks - 1 in order (bias_backward's f32 variant;
  // ops/matmul.cpp). A GPU then has N x chunks invocations at work, not N.
  static constexpr int64_t kColumnRows = 64;
  // Workgroups for nr rows of the LayerNorm and RMSNorm forward and dx shaders: 8 rows a
  // workgroup, 32 invocations a row (shaders/common/rows.glsl's ROWS_WG).
  static constexpr int64_t kNormRowsPerGroup = 8;
  static uint64_t norm_row_groups(int64_t nr) {
    return static_cast<uint64_t>((nr + kNormRowsPerGroup - 1) / kNormRowsPerGroup);
  }
  void add_column_partials(const Bound& dst, const Bound& partial, int64_t chunks, int64_t N);
  // matmul_kernel's body (ops/matmul.cpp): splits the product until every binding fits, the
  // epilogue `epi` (with its tensor *ep, c's shape) on the pieces that finish a sum.
  void matmul_split(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulDims& d,
                    bool trans_a, bool trans_b, float alpha, float beta, const Tensor* bias,
                    GemmCall::Epilogue epi, const Tensor* ep);
  // Workgroups for `n` invocations of workgroup size `local`, as (x, y) within device limits;
  // shaders rebuild the linear index with ct_linear_index() (shaders/common/index.glsl).
  std::array<uint32_t, 2> grid(uint64_t n, uint32_t local) const;
  // dst (=) src byte for byte (same dtype and numel), recorded as a transfer.
  void copy_bytes(const Tensor& dst, const Tensor& src);
  // A temporary device tensor, freed once the work recorded so far no longer needs it.
  Tensor workspace(const Shape& shape, DType dtype);
  bool cpu_like() const { return info_.type == DeviceType::kCpu; }
  bool has_bda() const { return pd_.bda; }
  // MM_SG matmul (matmul.comp): subgroups of 8 with subgroupBroadcast in compute
  bool has_int64() const { return pd_.int64; }
  bool has_sg8() const { return pd_.subgroup_size == 8 && pd_.subgroup_ballot; }
  uint32_t max_groups_x() const { return pd_.props.limits.maxComputeWorkGroupCount[0]; }
  // The cooperative-matrix GEMM's state here: the gate (coopmat.h), then the start-up self-test
  // (ops/matmul.cpp: correctness on ragged shapes and speed against the default GEMM, cached per
  // driver). coopmat_why() is the line `crosstrain devices` prints.
  bool coopmat_in_use() const { return cm_ok_; }
  const std::string& coopmat_why() const { return cm_why_; }

  // Called by VkBufferObj's destructor.
  void retire(VkBuffer buffer, const Allocation& alloc, MemCategory category, size_t size,
              bool tracked);

 protected:
  // The op kernels (core/op_checks.cpp has checked the arguments), one family per file under
  // ops/; upload and download in vk_device.cpp.
  void upload_kernel(const Tensor& dst, const void* host, size_t bytes) override;
  void download_kernel(void* host, const Tensor& src, size_t bytes) override;
  // One per line of core/ops.def, defined one family per file under ops/ (optimizers:
  // ops/optimizers.cpp).
#define CT_OP_KERNEL(op, params) void op##_kernel params override;
#include "core/ops.def"

 private:
  struct Batch {
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    std::vector<VkDescriptorPool> dpools;
    size_t dpool_cur = 0;
    uint64_t serial = 0;
    bool open = false;
    uint32_t commands = 0;
    VkQueryPool queries = VK_NULL_HANDLE;  // profiling: a timestamp pair per command
    std::vector<const char*> labels;       // what each timestamp pair measured
  };
  // A byte range of a buffer one command reads or writes.
  struct Access {
    VkBuffer buffer;
    VkDeviceSize lo, hi;
    bool write;
  };
  static constexpr uint32_t kMaxStamps = 8192;  // timestamps per batch (2 per command)
  struct Pipeline {
    VkDescriptorSetLayout dsl = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    VkPipeline pipeline = VK_NULL_HANDLE;
    std::string what;  // CROSSTRAIN_VK_PIPELINE_TIMES: its name until its first dispatch
  };
  static bool pipeline_times();
  struct Retired {
    uint64_t serial;
    VkBuffer buffer;
    Allocation alloc;
  };
  // A captured graph (begin_capture): its command buffer and descriptor pools, the buffers its
  // commands bind, and what the capture counted.
  struct Graph {
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    std::vector<VkDescriptorPool> dpools;
    size_t dpool_cur = 0;
    std::vector<std::shared_ptr<Buffer>> buffers;
    std::unordered_set<const Buffer*> seen;  // in `buffers` already (during the capture)
    uint64_t dispatches = 0;
    std::string refused;  // the first call refused during the capture, "" while none
  };

  void dispatch_raw(ShaderId id, const PipelineSpec* spec, const Bound* b, size_t nb,
                    const void* push, size_t push_size, uint32_t gx, uint32_t gy, uint32_t gz);
  // The open command buffer, begun on demand; during a capture the graph's.
  VkCommandBuffer cmd();
  void submit();  // submits the open command buffer, if any (flush() without counting)
  void barrier(VkCommandBuffer cb, bool to_host = false);
  // Records the barrier `acc` needs against the commands since the last one, then notes `acc`.
  void hazard(VkCommandBuffer cb, const Access* acc, size_t n);
  // Timestamps around one command when profiling (begin before, end after recording it).
  void stamp_begin(VkCommandBuffer cb, const char* label);
  void stamp_end(VkCommandBuffer cb);
  void collect_timestamps(Batch& b);
  // Device-lost aware result check: VK_ERROR_DEVICE_LOST marks the device lost for good.
  void check(VkResult r, const char* call);
  void ensure_alive() const;
  VkDescriptorSet descriptor_set(VkDescriptorSetLayout dsl);
  // During a capture: the graph keeps t's buffer (called wherever a command is handed one).
  void keep_for_graph(const Tensor& t) const;
  // Throws Error(kInvalidArgument) for `call` made during a capture (`why`: what it would need)
  // and invalidates the capture; a no-op outside one.
  void refuse_in_capture(const char* call, const std::string& why);
  void destroy_graph(Graph& g);
  Pipeline& pipeline(ShaderId id, const PipelineSpec* spec = nullptr);
  Pipeline create_pipeline(ShaderId id, const PipelineSpec* spec);
  std::shared_ptr<VkBufferObj> make_buffer(size_t bytes, MemCategory category, bool staging);
  void recycle(bool wait_all);
  Event download_async_kernel(void* host, const Tensor& src, size_t bytes) override;
  // Submits the open batch if it holds serial `serial`, then waits for every batch up to it.
  void wait_serial(uint64_t serial);
  // Copies the staged bytes of every async download whose batch has completed into host memory.
  void land_downloads();
  void check_validation(const char* where);
  void load_pipeline_cache();
  void save_pipeline_cache();
  std::string pipeline_cache_path() const;

  std::shared_ptr<Instance> instance_;
  const PhysicalDevice& pd_;
  Functions f_;
  DeviceInfo info_;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::unique_ptr<Allocator> alloc_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::array<Pipeline, kNumShaders> pipelines_{};
  // Specialized pipelines, keyed by (shader, the spec's constants, subgroup requirements).
  std::map<std::vector<uint32_t>, Pipeline> spec_pipelines_;
  std::unique_ptr<Batch> cur_;
  std::vector<std::unique_ptr<Batch>> inflight_, spare_;
  uint64_t next_serial_ = 1, completed_serial_ = 0;
  int64_t host_waits_ = 0;                      // counters()
  std::map<std::string, int64_t> gelu_counts_;  // counters(): the GELU epilogues' paths
  std::vector<Retired> retired_;
  // download_async copies waiting for their batch (serial) to complete, in serial order.
  struct AsyncDownload {
    uint64_t serial;
    std::shared_ptr<VkBufferObj> staging;
    void* host;
    size_t bytes;
  };
  std::vector<AsyncDownload> downloads_;
  uint64_t validation_seen_ = 0;
  // Graphs: the one being captured (cmd() records into it), the batch's hazards set aside
  // meanwhile, the graphs by number, and released ones waiting for their last replay's batch.
  std::unique_ptr<Graph> capture_;
  std::vector<Access> outside_pending_;
  std::map<int64_t, std::unique_ptr<Graph>> graphs_;
  std::vector<std::pair<uint64_t, std::unique_ptr<Graph>>> released_graphs_;
  int64_t next_graph_ = 1, graph_replays_ = 0;
  std::vector<Access> pending_;  // accesses since the last barrier
  bool lost_ = false;
  uint64_t inject_lost_at_ = 0;  // CROSSTRAIN_VK_INJECT_DEVICE_LOST=N: the Nth submit "fails"
  // CROSSTRAIN_VK_STRICT_MATH=1 (tests): ShaderId -> its CT_STRICT_MATH twin ("<name>_strict",
  // backends/vulkan/CMakeLists.txt) where one exists, else itself; empty when off.
  std::vector<uint32_t> strict_twin_;
  // Cooperative-matrix GEMM: usable (self-test passed), the emulated build standing in
  // (CROSSTRAIN_VK_COOPMAT=emulate), the verdict line, and what gemm() must use for hhf/hhh
  // products while the self-test runs (0: the normal choice, -1: never coopmat, 1: coopmat).
  CoopmatGate cm_gate_;  // the gate for this device, CROSSTRAIN_VK_COOPMAT read when opened
  bool cm_ok_ = false, cm_emulated_ = false;
  // The coopmat flash attention kernels passed their part of the self-test (the verdict line
  // holds kFlashCmInUse).
  bool cm_flash_ok_ = false;
  // bf16 GEMMs passed their part (the verdict line holds kGemmBf16CmInUse); f16 ones need cm_ok_.
  bool cm_bf16_ok_ = false;
  std::string cm_why_;
  int cm_force_ = 0;
  // The self-test's overrides of the coopmat tile (64, 128) and of split-k (S); 0: the rule.
  int cm_tile_force_ = 0, splitk_force_ = 0;
  void coopmat_start();                      // the gate, then the cached or a new verdict
  bool coopmat_self_test(std::string* why);  // ops/matmul.cpp
  // The coopmat flash attention kernel for a call (ops/flash_attention.cpp), and its part of the
  // self-test: the kernels against the scalar shaders on small ragged shapes.
  bool flash_cm(int kernel, DType dt, int64_t hs, ShaderId* id, PipelineSpec* spec, uint32_t* rows);
  bool coopmat_flash_self_test(std::string* why);
  // The three cross-entropy kernels' row loop (ops/crossentropy.cpp): `id` over logits [N, Vp]
  // (and targets) in pieces of rows that fit one binding; `out` is bound per row (losses [N]) or,
  // with out_rows_of_vp, per logits element (dlogits [N, Vp]).
  void crossentropy_rows(ShaderId id, const Tensor& out, bool out_rows_of_vp, const Tensor& logits,
                         const Tensor& targets, int64_t valid, float dloss);
  // counters (profile_report)
  uint64_t n_dispatches_ = 0, n_copies_ = 0, n_barriers_ = 0, n_submits_ = 0, n_flushes_ = 0;
  bool profiling_ = false;
  struct OpTime {
    uint64_t count = 0;
    double ns = 0;
  };
  std::map<std::string, OpTime> op_times_;
};

}  // namespace ct::vk
