// The CPU SIMT runtime: runs CUDA-style kernels (compiled by g++ through backends/gpu/
// portability.h) on the host. Blocks are spread over a pool of host threads; the threads of one
// block are fibers (Boost.Context) on one host thread, switched at __syncthreads and at every warp
// collective. Barriers and collectives are checked: a block whose threads wait at different
// __syncthreads, or wait while others have returned, raises an error naming kernel and block
// instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

// CUDA's vector types for launch geometry and indices.
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};

namespace ct::simt {

enum class Shuffle { kDown, kUp, kXor, kIdx, kBallot };

struct LaunchConfig {
  dim3 grid, block;
  std::size_t shared_bytes = 0;  // dynamic shared memory per block
  int warp_size = 32;            // 32 (simt) or 64 (simt64)
  const char* kernel = "kernel";
};

// A pool of host threads that blocks are spread over, and a stream launches are enqueued on (the
// launch runs at once: the stream is always idle). Results of a kernel without float atomics do
// not depend on the thread count.
//
// Graph capture, CUDA's stream capture: between begin_capture(graph) and end_capture() a launch on
// this runtime is checked as a GPU checks it and appended to `graph` with its arguments (by value,
// as kernel parameters are) instead of run; running the graph's nodes in order replays it. The
// device class (backends/gpu) refuses the calls CUDA refuses during a capture.
class Runtime {
 public:
  explicit Runtime(int threads);  // threads <= 0: the hardware concurrency
  // Another stream over the host threads of `pool_of` (which it keeps alive): launches run there,
  // and its capture is its own (a device's stream on the process-wide pool).
  explicit Runtime(Runtime* pool_of);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  int threads() const;
  // Runs body(block_index) for every block in [0, blocks); the first error is rethrown.
  void run_blocks(std::size_t blocks, void (*body)(void*, std::size_t), void* ctx);

  using Node = std::function<void()>;  // one recorded launch or copy
  void begin_capture(std::vector<Node>* graph) { capture_ = graph; }
  void end_capture() { capture_ = nullptr; }
  std::vector<Node>* capture() const { return capture_; }

 private:
  struct Pool;
  std::shared_ptr<Pool> pool_;
  std::vector<Node>* capture_ = nullptr;
};
Runtime& default_runtime();  // threads from CT_SIMT_THREADS, else the hardware concurrency

namespace detail {
struct Block;
struct BlockInfo {
  uint3 block_idx;
  dim3 block_dim, grid_dim;
};
struct Lane {
  uint3 thread_idx;
  const BlockInfo* info;
};
// initial-exec: read with one instruction, not a __tls_get_addr call per threadIdx, also inside
// the dlopen()ed simt plugins (one pointer of static TLS).
extern __thread Lane* current_lane
    __attribute__((tls_model("initial-exec")));  // the running fiber's lane
inline const BlockInfo& block_info() {
  return *current_lane->info;
}

using Entry = void (*)(void* call);
// Runs every block of the launch; call is handed to entry in every thread of every block.
void run_launch(Runtime* rt, const LaunchConfig& cfg, Entry entry, void* call);
// The launch's geometry and shared memory as a GPU checks them when it is enqueued; throws
// naming the kernel.
void check_launch(const LaunchConfig& cfg);
std::uint64_t warp_collective(Shuffle op, std::uint64_t bits, int arg, int width,
                              const std::source_location& where);
void* static_shared(const void* key, std::size_t bytes, std::size_t align);
void* dynamic_shared();
}  // namespace detail

// The lanes of the calling thread's warp that exist (a block's last warp may be partial).
std::uint64_t warp_member_mask();

namespace detail {
[[noreturn]] void over_launch_bounds(int max_threads, const char* spelled);
}
// CT_CHECK_LAUNCH_BOUNDS, a kernel's first statement: its block may have at most max_threads
// threads (`spelled` is the bound as the kernel writes it). Every thread checks before it runs
// any of the kernel, so a launch over the bound executes nothing and fails naming the kernel.
inline void check_launch_bounds(int max_threads, const char* spelled) {
  const dim3& b = detail::block_info().block_dim;
  if (std::size_t{b.x} * b.y * b.z > static_cast<std::size_t>(max_threads))
    detail::over_launch_bounds(max_threads, spelled);
}

template <typename T>
T shuffle(Shuffle op, T v, int arg, int width,
          const std::source_location& where = std::source_location::current()) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move <= 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = detail::warp_collective(op, bits, arg, width, where);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
inline std::uint64_t ballot(bool p,
                            const std::source_location& where = std::source_location::current()) {
  return detail::warp_collective(Shuffle::kBallot, p, 0, 0, where);
}

// Asynchronous 16-byte copies into shared memory (matrix_ops.h's ct_cp_async_*, PTX cp.async),
// as late as the hardware may complete them: a copy reads its source (or takes zeros, bytes 0)
// when issued and lands in shared memory only when this thread's async_wait(pending) retires the
// group it was committed in (every group but the newest `pending`); copies not committed when a
// wait comes stay pending, and those still pending when the thread returns never land. So a
// kernel that reads a staged tile before its wait, or waits for the wrong group, reads what was
// there before. The destination must be 16 bytes of the block's shared memory, 16-byte aligned.
void async_copy_16(void* dst, const void* src, int bytes);
void async_commit();
void async_wait(int pending);

// Warp-collective matrix instructions (backends/simt/matrix.cpp): every lane of a full warp
// arrives with pointers to its registers, the last one to arrive computes the instruction over
// all lanes' fragments (layouts: backends/gpu/matrix_layouts.h) and each lane leaves with its
// result. Checked like the shuffles: all lanes must call the same instruction at the same place,
// the warp must be whole and of the instruction's width (mma and ldmatrix 32, MFMA 64).
// Arithmetic: D = C + A B with, for every element, acc = c, then acc += a_k * b_k for
// k = 0 .. K-1 in order in f32 (the product is exact, one rounding per add). TF32 inputs are
// f32 bits taken as given with their low 13 mantissa bits cleared (truncated, not rounded).
enum class MatrixOp : unsigned char {
  kMmaF16,      // mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (warp 32)
  kMmaBF16,     // mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
  kMmaTf32,     // mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
  kLdmatrixX1,  // ldmatrix.sync.aligned.m8n8.x1.shared.b16 (warp 32)
  kLdmatrixX2,
  kLdmatrixX4,
  kLdmatrixX1Trans,  // ... .x1.trans ...
  kLdmatrixX2Trans,
  kLdmatrixX4Trans,
  kMfma32x32x8F16,    // v_mfma_f32_32x32x8f16 (warp 64)
  kMfma32x32x8BF16,   // v_mfma_f32_32x32x8bf16_1k
  kMfma16x16x16F16,   // v_mfma_f32_16x16x16f16
  kMfma16x16x16BF16,  // v_mfma_f32_16x16x16bf16_1k
};
const char* matrix_op_name(MatrixOp op);
int matrix_op_warp(MatrixOp op);  // the warp size the instruction is defined for
// One lane's operands. mma / MFMA: a, b (32-bit registers), c (f32) in, d (f32) out (d may be
// c). ldmatrix: row = this lane's row address (read from the lanes the instruction names; the
// others may pass anything), r = the 1, 2 or 4 registers it receives.
struct MatrixArgs {
  const std::uint32_t* a = nullptr;
  const std::uint32_t* b = nullptr;
  const float* c = nullptr;
  float* d = nullptr;
  const void* row = nullptr;
  std::uint32_t* r = nullptr;
};
namespace detail {
void matrix_collective(MatrixOp op, const MatrixArgs& args, const std::source_location& where);
// The arithmetic of a matrix instruction over a whole warp's operands (lanes[l] is lane l's);
// shared = the block's shared memory, which ldmatrix rows must lie in. Returns "" or what is
// wrong.
std::string compute_matrix(MatrixOp op, const MatrixArgs* const* lanes, const std::byte* shared_lo,
                           const std::byte* shared_hi);
}  // namespace detail
inline void matrix(MatrixOp op, const MatrixArgs& args,
                   const std::source_location& where = std::source_location::current()) {
  detail::matrix_collective(op, args, where);
}

template <typename T>
T* static_shared(const void* key, std::size_t count) {
  return static_cast<T*>(detail::static_shared(key, sizeof(T) * count, alignof(T)));
}
template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(detail::dynamic_shared());
}

// kernel(args...) over cfg.grid x cfg.block; returns when every block has finished. While `rt`
// captures, the launch is checked and recorded instead.
template <typename... P>
void launch(Runtime* rt, const LaunchConfig& cfg, void (*kernel)(P...), P... args) {
  struct Call {
    void (*kernel)(P...);
    std::tuple<P...> args;
  } call{kernel, std::tuple<P...>(args...)};
  const detail::Entry entry = [](void* c) {
    std::apply(static_cast<Call*>(c)->kernel, static_cast<Call*>(c)->args);
  };
  if (rt && rt->capture()) {
    detail::check_launch(cfg);
    rt->capture()->push_back(
        [rt, cfg, entry, call]() mutable { detail::run_launch(rt, cfg, entry, &call); });
    return;
  }
  detail::run_launch(rt, cfg, entry, &call);
}

}  // namespace ct::simt

#define threadIdx (::ct::simt::detail::current_lane->thread_idx)
#define blockIdx (::ct::simt::detail::block_info().block_idx)
#define blockDim (::ct::simt::detail::block_info().block_dim)
#define gridDim (::ct::simt::detail::block_info().grid_dim)

namespace ct::simt::detail {
void sync_block(const std::source_location& where);
}
inline void __syncthreads(std::source_location where = std::source_location::current()) {
  ::ct::simt::detail::sync_block(where);
}

// Atomics: fibers of one host thread never interleave inside a call, so only host threads race.
template <typename T>
inline T ct_simt_atomic_rmw(T* p, T v, int op) {
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  for (;;) {
    T next = op == 0 ? old + v : op == 1 ? (old < v ? v : old) : (v < old ? v : old);
    if (__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
      return old;
  }
}
inline int atomicAdd(int* p, int v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline float atomicAdd(float* p, float v) {
  return ct_simt_atomic_rmw(p, v, 0);
}
inline int atomicMax(int* p, int v) {
  return ct_simt_atomic_rmw(p, v, 1);
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  return ct_simt_atomic_rmw(p, v, 1);
}
inline int atomicMin(int* p, int v) {
  return ct_simt_atomic_rmw(p, v, 2);
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
  return ct_simt_atomic_rmw(p, v, 2);
}
inline int atomicOr(int* p, int v) {
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned atomicOr(unsigned* p, unsigned v) {
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T atomicCAS(T* p, T compare, T v) {
  static_assert(std::is_integral_v<T>, "atomicCAS takes int, unsigned or unsigned long long");
  __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}
template <typename T>
inline T atomicExch(T* p, T v) {
  T old;
  __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST);
  return old;
}
