// The CPU SIMT runtime's scheduler: a pool of host threads takes blocks; on its host thread a
// block's threads are fibers, run one warp at a time (Block::next_ready): a warp's lanes in turn
// until each waits (barrier, warp collective) or returns, the warp's collectives as they
// complete, then the next warp. A waiting fiber switches straight to the next ready one, and a
// fiber whose thread returns runs the next thread not yet started itself (yield, Block::start).
// Semantics and checks are described in simt.h.
#include "backends/simt/simt.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace ct::simt {
namespace ctx = boost::context;

namespace {
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kStackBytes = 512 << 10;
#else
constexpr std::size_t kStackBytes = 64 << 10;
#endif
constexpr std::size_t kStaticSharedLimit = 48 << 10;    // CUDA's static __shared__ limit
constexpr std::size_t kDynamicSharedLimit = 227 << 10;  // sm_90's opt-in maximum
constexpr unsigned char kPoison = 0xff;                 // fresh shared memory reads as NaN

// Fiber stacks (with a guard page below) kept per host thread and reused by every block.
class StackCache {
 public:
  ~StackCache() {
    for (void* p : free_) munmap(p, kStackBytes + page());
  }
  ctx::stack_context allocate() {
    void* base;
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    } else {
      base = mmap(nullptr, kStackBytes + page(), PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      mprotect(base, page(), PROT_NONE);
    }
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(base) + page() + kStackBytes;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) {
    free_.push_back(static_cast<char*>(sc.sp) - kStackBytes - page());
  }

 private:
  static std::size_t page() {
    static const std::size_t bytes = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    return bytes;
  }
  std::vector<void*> free_;
};

// AddressSanitizer must be told about every stack switch (Boost's fcontext does not tell it).
void switch_begin([[maybe_unused]] void** fake, [[maybe_unused]] const void* bottom,
                  [[maybe_unused]] std::size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(fake, bottom, size);
#endif
}
void switch_end([[maybe_unused]] void* fake, [[maybe_unused]] const void** bottom,
                [[maybe_unused]] std::size_t* size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake, bottom, size);
#endif
}

// Thrown into suspended fibers when their block fails, so their stacks unwind normally.
struct Abort {};

std::string where_str(const std::source_location& w) {
  std::string f = w.file_name();
  auto slash = f.rfind('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(w.line());
}
bool same_place(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::string_view(a.file_name()) == b.file_name());
}
const char* op_name(Shuffle op) {
  switch (op) {
    case Shuffle::kDown:
      return "shfl_down";
    case Shuffle::kUp:
      return "shfl_up";
    case Shuffle::kXor:
      return "shfl_xor";
    case Shuffle::kIdx:
      return "shfl_idx";
    case Shuffle::kBallot:
      return "vote";
  }
  return "?";
}
}  // namespace

namespace detail {
__thread Lane* current_lane __attribute__((tls_model("initial-exec"))) = nullptr;

enum class State : unsigned char { kReady, kBarrier, kWarp, kDone };

struct Block;
struct Fiber : Lane {
  Block* block = nullptr;
  const void* stack_bottom = nullptr;
  std::size_t stack_size = 0;
  void* fake_stack = nullptr;  // AddressSanitizer's, while suspended
  ctx::fiber self;             // this fiber while it is suspended
  State state = State::kDone;
  bool started = false;  // has (or had) an execution context: see Block::start
  int linear = 0;
  std::source_location at;  // where it waits
  // cp.async (async_copy_16): copies issued and not landed, in issue order, and the end (in
  // `copies`) of each committed group not yet retired.
  struct Copy {
    void* dst;
    unsigned char bytes[16];
  };
  std::vector<Copy> copies;
  std::vector<std::size_t> groups;
};

struct Warp {
  int members = 0, arrived = 0, done = 0;
  Shuffle op = Shuffle::kBallot;
  int width = 0;
  int matrix = -1;  // the MatrixOp the warp waits at, -1 at a shuffle or vote
  std::source_location at;
  std::uint64_t in[64], out[64];
  int arg[64];
  const MatrixArgs* margs[64];
};
// What a warp waits at, for messages.
const char* waits_at(const Warp& w) {
  return w.matrix >= 0 ? matrix_op_name(static_cast<MatrixOp>(w.matrix)) : op_name(w.op);
}

// One block in flight on a host thread; reused for every block that thread runs.
struct Block {
  BlockInfo info;
  const LaunchConfig* cfg = nullptr;
  Entry entry = nullptr;
  void* call = nullptr;
  int threads = 0, warp_size = 32, done = 0, barrier_arrived = 0;
  bool descending = false;  // the order warps run in (blocks with x + y + z odd: descending)
  bool restart = false;     // the fiber that switched back wants the order's first ready fiber
  std::source_location barrier_at;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<std::byte> arena;  // dynamic shared memory, then the static declarations
  std::size_t static_used = 0;
  std::vector<std::pair<const void*, std::size_t>> statics;  // key -> offset in arena
  std::exception_ptr error;
  bool aborting = false;
  StackCache stacks;
  ctx::fiber sched;                    // the scheduler while one of the block's fibers runs
  int last = 0;                        // the fiber that switched back to the scheduler
  const void* sched_bottom = nullptr;  // the scheduler's stack, for AddressSanitizer
  std::size_t sched_size = 0;
  void* sched_fake = nullptr;

  [[noreturn]] void fail(const std::string& what) const {
    const uint3& b = info.block_idx;
    throw std::runtime_error("simt: kernel " + std::string(cfg->kernel) + ", block (" +
                             std::to_string(b.x) + "," + std::to_string(b.y) + "," +
                             std::to_string(b.z) + "): " + what);
  }
  std::string thread_str(const Fiber& f) const {
    return "thread (" + std::to_string(f.thread_idx.x) + "," + std::to_string(f.thread_idx.y) +
           "," + std::to_string(f.thread_idx.z) + ")";
  }
  std::size_t dynamic_region() const { return (cfg->shared_bytes + 63) & ~std::size_t{63}; }
  void run(std::size_t index);
  // The schedule's next fiber (below); the common case inline: the next lane of from's warp.
  Fiber* next_ready(int from) {
    const int n = from + 1;
    if (from >= 0 && (n & (warp_size - 1)) != 0 && n < threads &&
        fibers[static_cast<std::size_t>(n)].state == State::kReady)
      return &fibers[static_cast<std::size_t>(n)];
    return next_ready_search(from);
  }
  Fiber* next_ready_search(int from);
  void start(Fiber& f);
  void resume(Fiber& f);
  void abort_suspended();
  void check_finished(const Fiber& f);
  [[noreturn]] void deadlock() const;
};

thread_local Block tls_block;  // the block this host thread runs

Fiber& current() {
  if (!current_lane) throw std::logic_error("simt: a device function was called outside a kernel");
  return *static_cast<Fiber*>(current_lane);
}
struct StackRef {
  StackCache* cache;
  Fiber* fiber;
  ctx::stack_context allocate() {
    ctx::stack_context sc = cache->allocate();
    fiber->stack_bottom = static_cast<char*>(sc.sp) - sc.size;
    fiber->stack_size = sc.size;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) { cache->deallocate(sc); }
};

// The schedule: one warp at a time, as a GPU may run them. After a fiber waits, the next ready
// lane of its warp runs (after it, then from the warp's first lane); when its warp has none, the
// next warp with a ready lane in the block's order: ascending warp numbers in blocks whose
// x + y + z is even, descending in the others (the order wraps around). A barrier, once all threads
// arrive, starts again from the order's first warp. So between two barriers each warp runs all
// its code (its collectives included) before the next warp starts: a missing barrier shows as a
// warp reading shared memory that another warp has already overwritten, or not yet written, in
// one of the two orders. (Every thread waiting in turn, warp by warp, instead would let every
// warp finish a collective's reads before any warp wrote: such races passed unseen.)
// Returns nullptr when no fiber is ready; from = -1: the order's first ready fiber.
Fiber* Block::next_ready_search(int from) {
  const int nw = static_cast<int>(warps.size());
  auto ready_in = [&](int w, int l0) -> Fiber* {
    const int end = std::min((w + 1) * warp_size, threads);
    for (int l = w * warp_size + l0; l < end; ++l)
      if (fibers[l].state == State::kReady) return &fibers[l];
    return nullptr;
  };
  int w0;
  if (from >= 0) {
    w0 = from / warp_size;
    if (Fiber* g = ready_in(w0, from % warp_size + 1)) return g;
    if (Fiber* g = ready_in(w0, 0)) return g;
  } else {
    w0 = descending ? 0 : nw - 1;  // so that the first warp tried below is the order's first
  }
  for (int k = 1; k <= nw; ++k)
    if (Fiber* g = ready_in(descending ? (w0 - k + nw) % nw : (w0 + k) % nw, 0)) return g;
  return nullptr;
}

// A waiting fiber hands the host thread straight to the fiber the schedule runs next (one switch
// instead of two through the scheduler); when none is ready it goes back to the scheduler. Under
// AddressSanitizer every switch goes through the scheduler, whose stack the fibers record when it
// resumes them. first: the next fiber is the order's first ready one (after a barrier; f is ready
// itself then, and runs on if it is that one).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kHandoff = false;
#else
constexpr bool kHandoff = true;
#endif

void yield(Fiber& f, bool first = false) {
  Block& b = *f.block;
  auto park = [&f](ctx::fiber&& from) {
    f.self = std::move(from);
    return ctx::fiber{};
  };
  if constexpr (kHandoff) {
    if (Fiber* g = b.next_ready(first ? -1 : f.linear)) {
      if (g == &f) return;
      if (!g->started) b.start(*g);
      current_lane = g;
      std::move(g->self).resume_with(park);
      if (b.aborting) throw Abort{};
      return;
    }
  }
  b.last = f.linear;
  b.restart = first;
  switch_begin(&f.fake_stack, b.sched_bottom, b.sched_size);
  std::move(b.sched).resume_with(park);
  switch_end(f.fake_stack, &b.sched_bottom, &b.sched_size);
  if (b.aborting) throw Abort{};
}

// Runs f (and the fibers it hands over to) until one switches back; last names that one.
void Block::resume(Fiber& f) {
  if (!f.started) start(f);
  current_lane = &f;
  switch_begin(&sched_fake, f.stack_bottom, f.stack_size);
  std::move(f.self).resume_with([this](ctx::fiber&& from) {
    sched = std::move(from);
    return ctx::fiber{};
  });
  switch_end(sched_fake, nullptr, nullptr);
  current_lane = nullptr;
}

// Gives thread `first` an execution context (a fiber on a cached stack), when it is first resumed.
// When its thread returns and the next thread has not started yet, the context runs that one too,
// with no switch and no new fiber (the scheduler would resume it next anyway): a block that never
// waits runs all its threads on one fiber. Not under AddressSanitizer (each thread its own stack).
void Block::start(Fiber& first) {
  first.started = true;
  first.self =
      ctx::fiber(std::allocator_arg, StackRef{&stacks, &first}, [this, &first](ctx::fiber&&) {
        switch_end(nullptr, &sched_bottom, &sched_size);
        Fiber* f = &first;
        for (;;) {
          try {
            if (!aborting) entry(call);
          } catch (const ctx::detail::forced_unwind&) {
            throw;
          } catch (const Abort&) {
          } catch (...) {
            if (!error) error = std::current_exception();
          }
          f->state = State::kDone;
          if (!kHandoff || error || aborting || f->linear + 1 >= threads) break;
          Fiber& g = fibers[f->linear + 1];
          if (g.started || g.state != State::kReady) break;
          try {
            check_finished(*f);
          } catch (...) {
            error = std::current_exception();
            break;
          }
          g.started = true;
          current_lane = f = &g;
        }
        last = f->linear;
        switch_begin(nullptr, sched_bottom, sched_size);
        return std::move(sched);
      });
}

// After an error: every fiber not yet returned is resumed once more and unwinds (Abort).
void Block::abort_suspended() {
  aborting = true;
  for (int i = 0; i < threads; ++i)
    if (fibers[i].self) resume(fibers[i]);
}

void Block::run(std::size_t index) {
  const dim3& g = info.grid_dim;
  info.block_idx = {static_cast<unsigned>(index % g.x), static_cast<unsigned>(index / g.x % g.y),
                    static_cast<unsigned>(index / (std::size_t{g.x} * g.y))};
  done = barrier_arrived = 0;
  error = nullptr;
  aborting = false;
  // (x + y + z, not the linear index: with an even grid width that would follow x alone)
  descending = (info.block_idx.x + info.block_idx.y + info.block_idx.z) % 2 == 1;
  restart = false;
  statics.clear();
  static_used = 0;
  std::fill_n(arena.begin(), cfg->shared_bytes, std::byte{kPoison});
  for (Warp& w : warps) w.arrived = w.done = 0;

  const dim3& bd = info.block_dim;
  for (int i = 0; i < threads; ++i) {
    Fiber& f = fibers[i];
    f.thread_idx = {i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y)};
    f.info = &info;
    f.block = this;
    f.linear = i;
    f.state = State::kReady;
    f.started = false;
    f.copies.clear();
    f.groups.clear();
  }
  // On any exit, suspended fibers are unwound and their stacks go back to the cache.
  struct Cleanup {
    Block* b;
    ~Cleanup() {
      current_lane = nullptr;
      b->abort_suspended();
    }
  } cleanup{this};

  for (int from = -1; done < threads;) {
    Fiber* f = next_ready(from);
    if (!f) deadlock();
    resume(*f);
    if (error) std::rethrow_exception(error);
    from = restart ? -1 : last;  // f may have handed over to others
    restart = false;
    if (fibers[last].state == State::kDone) check_finished(fibers[last]);
  }
}

void Block::check_finished(const Fiber& f) {
  ++done;
  Warp& w = warps[f.linear / warp_size];
  ++w.done;
  if (barrier_arrived > 0)
    fail(thread_str(f) + " returned while " + std::to_string(barrier_arrived) +
         " threads wait at __syncthreads (" + where_str(barrier_at) + ")");
  if (w.arrived > 0)
    fail(thread_str(f) + " returned while " + std::to_string(w.arrived) +
         " lanes of its warp wait at " + waits_at(w) + " (" + where_str(w.at) + ")");
}

void Block::deadlock() const {
  std::string what = "deadlock: no thread can run;";
  if (barrier_arrived > 0)
    what.append(1, ' ')
        .append(std::to_string(barrier_arrived))
        .append(" wait at __syncthreads (")
        .append(where_str(barrier_at))
        .append(");");
  for (std::size_t k = 0; k < warps.size(); ++k)
    if (warps[k].arrived > 0)
      what.append(1, ' ')
          .append(std::to_string(warps[k].arrived))
          .append(" lanes of warp ")
          .append(std::to_string(k))
          .append(" wait at ")
          .append(waits_at(warps[k]))
          .append(" (")
          .append(where_str(warps[k].at))
          .append(");");
  what.append(1, ' ').append(std::to_string(done)).append(" returned");
  fail(what);
}

void sync_block(const std::source_location& where) {
  Fiber& f = current();
  Block& b = *f.block;
  if (b.done > 0)
    b.fail(b.thread_str(f) + " waits at __syncthreads (" + where_str(where) + ") but " +
           std::to_string(b.done) + " threads of the block have returned");
  if (b.barrier_arrived == 0) {
    b.barrier_at = where;
  } else if (!same_place(where, b.barrier_at)) {
    b.fail(b.thread_str(f) + " waits at __syncthreads (" + where_str(where) +
           ") while others wait at a different one (" + where_str(b.barrier_at) + ")");
  }
  if (++b.barrier_arrived == b.threads) {
    b.barrier_arrived = 0;
    for (int i = 0; i < b.threads; ++i)
      if (b.fibers[i].state == State::kBarrier) b.fibers[i].state = State::kReady;
    yield(f, true);  // the order's first warp runs first (f runs on if it is that warp's)
    return;
  }
  f.state = State::kBarrier;
  yield(f);
}

// CUDA's rules (PTX shfl.sync with c = ((warp - width) << 8) | clamp): a warp is cut into
// segments of `width` lanes; down and xor may not read past the segment's last lane, up not below
// its first, idx reads lane (src mod width) of the segment; a lane whose source is out of bounds,
// or does not exist (a partial last warp), keeps its own value. xor may read an earlier segment.
void compute(Warp& w, int warp_size) {
  if (w.op == Shuffle::kBallot) {
    std::uint64_t mask = 0;
    for (int l = 0; l < w.members; ++l) mask |= (w.in[l] & 1) << l;
    std::fill_n(w.out, w.members, mask);
    return;
  }
  for (int l = 0; l < w.members; ++l) {
    const int first = l & ~(w.width - 1), last = first + w.width - 1, a = w.arg[l];
    int j = l;
    bool ok = true;
    switch (w.op) {
      case Shuffle::kDown:
        j = l + a;
        ok = a >= 0 && j <= last;
        break;
      case Shuffle::kUp:
        j = l - a;
        ok = a >= 0 && j >= first;
        break;
      case Shuffle::kXor:
        j = l ^ (a & (warp_size - 1));
        ok = j <= last;
        break;
      case Shuffle::kIdx:
        j = first + (a & (w.width - 1));
        break;
      case Shuffle::kBallot:
        break;
    }
    if (!ok || j >= w.members) j = l;
    w.out[l] = w.in[j];
  }
}

std::uint64_t warp_collective(Shuffle op, std::uint64_t bits, int arg, int width,
                              const std::source_location& where) {
  Fiber& f = current();
  Block& b = *f.block;
  const int lane = f.linear % b.warp_size;
  Warp& w = b.warps[f.linear / b.warp_size];
  if (op != Shuffle::kBallot && (width < 1 || width > b.warp_size || (width & (width - 1))))
    b.fail(b.thread_str(f) + ": " + op_name(op) + " (" + where_str(where) + ") with width " +
           std::to_string(width) + ": not a power of two <= the warp size " +
           std::to_string(b.warp_size));
  if (w.done > 0)
    b.fail(b.thread_str(f) + " calls " + op_name(op) + " (" + where_str(where) + ") but " +
           std::to_string(w.done) + " lanes of its warp have returned");
  if (w.arrived == 0) {
    w.op = op;
    w.width = width;
    w.matrix = -1;
    w.at = where;
  } else if (w.matrix >= 0) {
    b.fail(b.thread_str(f) + " calls " + op_name(op) + " (" + where_str(where) +
           ") while its warp waits at " + waits_at(w) + " (" + where_str(w.at) + ")");
  } else if (w.op != op || w.width != width) {
    b.fail(b.thread_str(f) + " calls " + op_name(op) + " width " + std::to_string(width) + " (" +
           where_str(where) + ") while its warp waits at " + op_name(w.op) + " width " +
           std::to_string(w.width) + " (" + where_str(w.at) + ")");
  }
  w.in[lane] = bits;
  w.arg[lane] = arg;
  if (++w.arrived == w.members) {
    w.arrived = 0;
    compute(w, b.warp_size);
    const int base = f.linear - lane;
    for (int l = 0; l < w.members; ++l)
      if (b.fibers[base + l].state == State::kWarp) b.fibers[base + l].state = State::kReady;
    return w.out[lane];
  }
  f.state = State::kWarp;
  yield(f);
  return w.out[lane];
}

// As warp_collective, for the matrix instructions: the whole warp (which must be full and of the
// instruction's width) arrives at the same call; the last lane computes for all.
void matrix_collective(MatrixOp op, const MatrixArgs& args, const std::source_location& where) {
  Fiber& f = current();
  Block& b = *f.block;
  const int lane = f.linear % b.warp_size;
  Warp& w = b.warps[f.linear / b.warp_size];
  const char* name = matrix_op_name(op);
  if (b.warp_size != matrix_op_warp(op))
    b.fail(b.thread_str(f) + ": " + name + " (" + where_str(where) + ") is a " +
           std::to_string(matrix_op_warp(op)) + "-lane instruction; this launch runs warps of " +
           std::to_string(b.warp_size));
  if (w.members != b.warp_size)
    b.fail(b.thread_str(f) + ": " + name + " (" + where_str(where) +
           ") needs a full warp; this one has " + std::to_string(w.members) + " lanes");
  if (w.done > 0)
    b.fail(b.thread_str(f) + " calls " + name + " (" + where_str(where) + ") but " +
           std::to_string(w.done) + " lanes of its warp have returned");
  if (w.arrived == 0) {
    w.matrix = static_cast<int>(op);
    w.at = where;
  } else if (w.matrix != static_cast<int>(op) || !same_place(where, w.at)) {
    b.fail(b.thread_str(f) + " calls " + name + " (" + where_str(where) +
           ") while its warp waits at " + waits_at(w) + " (" + where_str(w.at) + ")");
  }
  w.margs[lane] = &args;
  if (++w.arrived == w.members) {
    w.arrived = 0;
    const std::string error =
        compute_matrix(op, w.margs, b.arena.data(), b.arena.data() + b.arena.size());
    if (!error.empty()) b.fail(std::string(name) + " (" + where_str(where) + "): " + error);
    const int base = f.linear - lane;
    for (int l = 0; l < w.members; ++l)
      if (b.fibers[base + l].state == State::kWarp) b.fibers[base + l].state = State::kReady;
    return;
  }
  f.state = State::kWarp;
  yield(f);
}

void* static_shared(const void* key, std::size_t bytes, std::size_t align) {
  Block& b = *current().block;
  for (auto& [k, offset] : b.statics)
    if (k == key) return b.arena.data() + offset;
  align = std::max<std::size_t>(align, 16);
  std::size_t offset = (b.static_used + align - 1) & ~(align - 1);
  if (offset + bytes > kStaticSharedLimit)
    b.fail("static shared memory over " + std::to_string(kStaticSharedLimit) + " bytes");
  b.static_used = offset + bytes;
  offset += b.dynamic_region();
  b.statics.emplace_back(key, offset);
  std::fill_n(b.arena.begin() + static_cast<std::ptrdiff_t>(offset), bytes, std::byte{kPoison});
  return b.arena.data() + offset;
}

void* dynamic_shared() {
  Block& b = *current().block;
  return b.cfg->shared_bytes ? b.arena.data() : nullptr;
}

}  // namespace detail

void async_copy_16(void* dst, const void* src, int bytes) {
  detail::Fiber& f = detail::current();
  detail::Block& b = *f.block;
  const auto* d = static_cast<const std::byte*>(dst);
  if (d < b.arena.data() || d + 16 > b.arena.data() + b.arena.size() ||
      reinterpret_cast<std::uintptr_t>(dst) % 16 != 0)
    b.fail(b.thread_str(f) +
           ": cp.async (ct_cp_async_16) to an address outside the block's "
           "shared memory or not 16-byte aligned");
  if (bytes != 0 && bytes != 16)
    b.fail(b.thread_str(f) + ": cp.async (ct_cp_async_16) of " + std::to_string(bytes) +
           " bytes (16, or 0 for zeros)");
  detail::Fiber::Copy c{dst, {}};
  if (bytes) std::memcpy(c.bytes, src, 16);
  f.copies.push_back(c);
}

void async_commit() {
  detail::Fiber& f = detail::current();
  f.groups.push_back(f.copies.size());
}

void async_wait(int pending) {
  detail::Fiber& f = detail::current();
  const std::size_t n = f.groups.size();
  if (pending < 0 || n <= static_cast<std::size_t>(pending)) return;
  const std::size_t retire = n - static_cast<std::size_t>(pending), end = f.groups[retire - 1];
  for (std::size_t i = 0; i < end; ++i) std::memcpy(f.copies[i].dst, f.copies[i].bytes, 16);
  f.copies.erase(f.copies.begin(), f.copies.begin() + static_cast<std::ptrdiff_t>(end));
  f.groups.erase(f.groups.begin(), f.groups.begin() + static_cast<std::ptrdiff_t>(retire));
  for (std::size_t& g : f.groups) g -= end;
}

namespace detail {

namespace {
struct LaunchJob {
  const LaunchConfig* cfg;
  Entry entry;
  void* call;
};
void run_one_block(void* job_ptr, std::size_t index) {
  const LaunchJob& job = *static_cast<const LaunchJob*>(job_ptr);
  Block& b = tls_block;
  const LaunchConfig& cfg = *job.cfg;
  b.cfg = &cfg;
  b.entry = job.entry;
  b.call = job.call;
  b.info.block_dim = cfg.block;
  b.info.grid_dim = cfg.grid;
  b.warp_size = cfg.warp_size;
  b.threads = static_cast<int>(cfg.block.x * cfg.block.y * cfg.block.z);
  if (b.fibers.size() < static_cast<std::size_t>(b.threads)) b.fibers.resize(b.threads);
  const int nwarps = (b.threads + b.warp_size - 1) / b.warp_size;
  b.warps.resize(nwarps);
  for (int k = 0; k < nwarps; ++k)
    b.warps[k].members = std::min(b.warp_size, b.threads - k * b.warp_size);
  const std::size_t arena = b.dynamic_region() + kStaticSharedLimit;
  if (b.arena.size() < arena) b.arena.resize(arena);
  b.run(index);
}
}  // namespace

void check_launch(const LaunchConfig& cfg) {
  auto bad = [&](const std::string& what) {
    throw std::runtime_error("simt: launch of " + std::string(cfg.kernel) + ": " + what);
  };
  const dim3 &g = cfg.grid, &bd = cfg.block;
  if (cfg.warp_size != 32 && cfg.warp_size != 64) bad("warp size must be 32 or 64");
  if (!g.x || !g.y || !g.z || !bd.x || !bd.y || !bd.z) bad("a grid or block dimension is 0");
  if (g.y > 65535 || g.z > 65535) bad("grid.y and grid.z are at most 65535");
  if (bd.z > 64 || std::size_t{bd.x} * bd.y * bd.z > 1024) bad("more than 1024 threads per block");
  if (cfg.shared_bytes > kDynamicSharedLimit) bad("dynamic shared memory over 227 KiB");
  if (current_lane) bad("kernels cannot launch kernels here");
}

void run_launch(Runtime* rt, const LaunchConfig& cfg, Entry entry, void* call) {
  check_launch(cfg);
  const dim3& g = cfg.grid;
  LaunchJob job{&cfg, entry, call};
  (rt ? *rt : default_runtime()).run_blocks(std::size_t{g.x} * g.y * g.z, run_one_block, &job);
}

// Reported as run_launch reports a bad launch: a GPU refuses the launch itself.
void over_launch_bounds(int max_threads, const char* spelled) {
  const Block& b = *current().block;
  const dim3& bd = b.cfg->block;
  throw std::runtime_error("simt: launch of " + std::string(b.cfg->kernel) + ": block (" +
                           std::to_string(bd.x) + "," + std::to_string(bd.y) + "," +
                           std::to_string(bd.z) + ") has " + std::to_string(b.threads) +
                           " threads, over the kernel's CT_LAUNCH_BOUNDS(" + spelled +
                           ") = " + std::to_string(max_threads));
}
}  // namespace detail

std::uint64_t warp_member_mask() {
  detail::Fiber& f = detail::current();
  const int m = f.block->warps[f.linear / f.block->warp_size].members;
  return m == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << m) - 1;
}

// --- the host thread pool --------------------------------------------------------------------
struct Runtime::Pool {
  int threads = 1;
  std::vector<std::thread> workers;
  std::mutex launch_mutex;  // one launch at a time per runtime
  std::mutex m;
  std::condition_variable wake, finished;
  std::uint64_t generation = 0;
  bool stop = false;
  int busy = 0;
  // the current job
  std::size_t blocks = 0;
  void (*body)(void*, std::size_t) = nullptr;
  void* ctx = nullptr;
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;

  void work() {
    while (!failed.load(std::memory_order_relaxed)) {
      const std::size_t i = next.fetch_add(1);
      if (i >= blocks) return;
      try {
        body(ctx, i);
      } catch (...) {
        std::lock_guard lock(m);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  }
  ~Pool() {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    wake.notify_all();
    for (auto& t : workers) t.join();
  }
  void worker() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(m);
        wake.wait(lock, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
      }
      work();
      std::lock_guard lock(m);
      if (--busy == 0) finished.notify_one();
    }
  }
};

Runtime::Runtime(int threads) : pool_(std::make_shared<Pool>()) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  pool_->threads = threads;
  for (int i = 1; i < threads; ++i) pool_->workers.emplace_back([p = pool_.get()] { p->worker(); });
}

Runtime::Runtime(Runtime* pool_of) : pool_(pool_of->pool_) {}

Runtime::~Runtime() = default;  // the last stream of a pool stops its threads (~Pool)

int Runtime::threads() const {
  return pool_->threads;
}

void Runtime::run_blocks(std::size_t blocks, void (*body)(void*, std::size_t), void* ctx) {
  Pool& p = *pool_;
  std::lock_guard launch(p.launch_mutex);
  {
    std::lock_guard lock(p.m);
    p.blocks = blocks;
    p.body = body;
    p.ctx = ctx;
    p.next = 0;
    p.failed = false;
    p.error = nullptr;
    p.busy = static_cast<int>(p.workers.size());
    ++p.generation;
  }
  p.wake.notify_all();
  p.work();
  std::unique_lock lock(p.m);
  p.finished.wait(lock, [&] { return p.busy == 0; });
  if (p.error) std::rethrow_exception(p.error);
}

Runtime& default_runtime() {
  static Runtime rt([] {
    const char* env = std::getenv("CT_SIMT_THREADS");
    return env ? std::atoi(env) : 0;
  }());
  return rt;
}

}  // namespace ct::simt
