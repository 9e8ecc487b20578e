// The CPU SIMT runtime (backends/simt) against CUDA's semantics: barriers, the warp-at-a-time
// schedule, divergent warps, shuffles with explicit widths at warp size 32 and 64, votes, shared
// memory per block, atomics, odd launch geometry, and kernel errors reported instead of hanging.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/gpu/portability.h"

namespace {

using ct::gpu::launch;
using ct::simt::Runtime;

// --- kernels -----------------------------------------------------------------------------------

// x is (gridDim.x * 256), out is (gridDim.x): a pairwise tree in shared memory, a barrier per
// level.
__global__ void CT_LAUNCH_BOUNDS(256) tree_sum(const float* x, float* out) {
  CT_CHECK_LAUNCH_BOUNDS(256);
  CT_SHARED(float, s, 256);
  const unsigned t = threadIdx.x;
  s[t] = x[blockIdx.x * 256 + t];
  __syncthreads();
  for (unsigned half = 128; half > 0; half /= 2) {
    if (t < half) s[t] += s[t + half];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// x, out are (gridDim.x, blockDim.x): inclusive prefix sums per block (Hillis-Steele), two
// barriers per level: every read of a level happens before any write of it.
__global__ void CT_LAUNCH_BOUNDS(1024) block_scan(const int* x, int* out) {
  CT_CHECK_LAUNCH_BOUNDS(1024);
  CT_DYNAMIC_SHARED(int, s);
  const unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
  s[t] = x[base + t];
  __syncthreads();
  for (unsigned d = 1; d < n; d *= 2) {
    const int add = t >= d ? s[t - d] : 0;
    __syncthreads();
    s[t] += add;
    __syncthreads();
  }
  out[base + t] = s[t];
}

// out is (blockDim.x): lanes take different branches and loop counts, then meet at one shuffle.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(128) divergent(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(128);
  const int t = threadIdx.x;
  int v = 0;
  if (t % 3 == 0) {
    for (int i = 0; i < t; ++i) v += 2;  // v = 2t
  } else if (t % 3 == 1) {
    v = t * 2;
  } else {
    int k = t;
    while (k > 0) {
      v += 2;
      --k;
    }
  }
  out[t] = ct_shfl_xor(v, 1, WARP);  // every lane has v = 2t
}

// in, out are (4, blockDim.x): out[k][t] = shuffle k (down, up, xor, idx) of in[k][t].
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(256) shuffles(const int* in, int* out, int arg, int width) {
  CT_CHECK_LAUNCH_BOUNDS(256);
  const int t = threadIdx.x, n = blockDim.x;
  out[0 * n + t] = ct_shfl_down(in[0 * n + t], arg, width);
  out[1 * n + t] = ct_shfl_up(in[1 * n + t], arg, width);
  out[2 * n + t] = ct_shfl_xor(in[2 * n + t], arg, width);
  out[3 * n + t] = ct_shfl_idx(in[3 * n + t], arg + t % WARP % 3, width);  // per-lane source
}

// out is (blockDim.x, 4): ballot of t%3==0, any(t==5), all(true), all(t!=7).
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(256) votes(unsigned long long* out) {
  CT_CHECK_LAUNCH_BOUNDS(256);
  const int t = threadIdx.x;
  out[t * 4 + 0] = ct_ballot(t % 3 == 0);
  out[t * 4 + 1] = ct_any(t == 5);
  out[t * 4 + 2] = ct_all(true);
  out[t * 4 + 3] = ct_all(t != 7);
}

// out is (gridDim.x, blockDim.x). Block b sees fresh shared memory (every byte 0xff), writes its
// own pattern, and each thread reads its neighbour's slot of both arrays.
__global__ void CT_LAUNCH_BOUNDS(128) shared_per_block(unsigned* out, unsigned* fresh) {
  CT_CHECK_LAUNCH_BOUNDS(128);
  CT_SHARED(unsigned, a, 128);
  CT_SHARED(unsigned, b, 128);
  CT_DYNAMIC_SHARED(unsigned, d);
  const unsigned t = threadIdx.x, n = blockDim.x;
  if (a[t] != 0xffffffffu || b[t] != 0xffffffffu || d[t] != 0xffffffffu) atomicAdd(fresh, 1u);
  __syncthreads();
  a[t] = blockIdx.x * 1000 + t;
  b[t] = blockIdx.x * 7 + t * 3;
  d[t] = a[t] + b[t];
  __syncthreads();
  const unsigned u = (t + 1) % n;
  out[blockIdx.x * n + t] = a[u] * 2 + b[u] + d[u];
}

// counters: [int sum, int max, unsigned cas-increments], fsum: float ones.
__global__ void CT_LAUNCH_BOUNDS(128) atomics(int* counters, float* fsum) {
  CT_CHECK_LAUNCH_BOUNDS(128);
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&counters[0], 1);
  atomicMax(&counters[1], g);
  unsigned* c = reinterpret_cast<unsigned*>(&counters[2]);
  unsigned old = *c, seen;
  while ((seen = atomicCAS(c, old, old + 1)) != old) old = seen;
  atomicAdd(fsum, 1.0f);
}

// out is (grid volume * block volume): the global linear index of every thread, once.
__global__ void CT_LAUNCH_BOUNDS(1024) geometry(int* out, int* bad) {
  CT_CHECK_LAUNCH_BOUNDS(1024);
  const unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  if (threadIdx.x >= blockDim.x || threadIdx.y >= blockDim.y || threadIdx.z >= blockDim.z ||
      blockIdx.x >= gridDim.x || blockIdx.y >= gridDim.y || blockIdx.z >= gridDim.z)
    atomicAdd(bad, 1);
  atomicAdd(&out[bx * per_block + tx], 1);
}

__global__ void CT_LAUNCH_BOUNDS(64) early_return(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void CT_LAUNCH_BOUNDS(64) split_barriers(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(64) barrier_vs_shuffle(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  int v = threadIdx.x;
  if (threadIdx.x < 16)
    __syncthreads();
  else
    v = ct_shfl_down(v, 1, WARP);
  out[threadIdx.x] = v;
}

template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(64) mixed_collectives(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  int v = threadIdx.x;
  if (threadIdx.x % 2)
    v = ct_shfl_down(v, 1, WARP);
  else
    v = ct_shfl_xor(v, 1, WARP);
  out[threadIdx.x] = v;
}

__global__ void CT_LAUNCH_BOUNDS(64) too_much_static_shared(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  CT_SHARED(int, big, 13000);  // 52,000 bytes: over CUDA's 48 KiB of static shared memory
  big[threadIdx.x] = 1;
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void CT_LAUNCH_BOUNDS(64) throws_in_kernel(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(64);
  if (blockIdx.x == 2 && threadIdx.x == 9) throw std::domain_error("kernel says no");
  __syncthreads();
  out[threadIdx.x] = 1;
}

// out is (gridDim.x, blockDim.y, blockDim.x): every thread writes 1. At most 2 * WARP threads a
// block: the bound depends on the template's WARP, as the matmul tile kernel's does.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(2 * WARP) bounded(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(2 * WARP);
  const unsigned per_block = blockDim.x * blockDim.y;
  out[blockIdx.x * per_block + threadIdx.y * blockDim.x + threadIdx.x] = 1;
}

// out is (gridDim.x, 4 blockDim.x): the warp of each thread in the order the threads pass two
// points in each of two phases, before and after a shuffle, with a barrier between the phases.
// (A plain counter in shared memory: the SIMT runtime runs a block's threads on one host thread.
// The test is of the runtime's schedule; on a GPU the kernel would be a race.)
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(256) schedule_order(int* out) {
  CT_CHECK_LAUNCH_BOUNDS(256);
  CT_SHARED(int, next, 1);
  const int w = static_cast<int>(threadIdx.x) / WARP;
  int* o = out + blockIdx.x * 4 * blockDim.x;
  if (threadIdx.x == 0) *next = 0;
  __syncthreads();
  for (int phase = 0; phase < 2; ++phase) {
    o[(*next)++] = w;
    o[(*next)++] = ct_shfl_xor(w, 1, WARP);  // the same warp's lane: w
    __syncthreads();
  }
}

// --- CUDA's shuffle rules, spelled out case by case ----------------------------------------------
int expect(int kind, const std::vector<int>& in, int lane, int arg, int width, int members) {
  const int seg = lane / width * width;
  int src = lane;
  if (kind == 0 && lane % width + arg < width) src = lane + arg;  // down
  if (kind == 1 && lane % width >= arg) src = lane - arg;         // up
  if (kind == 2 && (lane ^ arg) < seg + width) src = lane ^ arg;  // xor
  if (kind == 3) src = seg + (arg + lane % 3) % width;            // idx
  return src < members ? in[src] : in[lane];
}

template <int WARP>
void check_shuffles(Runtime& rt, int threads, int arg, int width) {
  std::vector<int> in(4 * threads), out(4 * threads);
  for (int i = 0; i < 4 * threads; ++i) in[i] = 1000 + 7 * i;
  launch<WARP>(CT_KERNEL(shuffles<WARP>), dim3(1), dim3(threads), 0, &rt, in.data(), out.data(),
               arg, width);
  for (int k = 0; k < 4; ++k)
    for (int t = 0; t < threads; ++t) {
      const int warp0 = t / WARP * WARP;
      const int members = std::min(WARP, threads - warp0);
      std::vector<int> lanes(in.begin() + k * threads + warp0,
                             in.begin() + k * threads + warp0 + members);
      ASSERT_EQ(out[k * threads + t], expect(k, lanes, t - warp0, arg, width, members))
          << "warp " << WARP << " kind " << k << " lane " << t << " arg " << arg << " width "
          << width;
    }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// --- tests --------------------------------------------------------------------------------------

TEST(SimtRuntime, BarrierTreeEqualsSequentialSumAtEveryWarpAndThreadCount) {
  const int blocks = 37;
  std::vector<float> exact(blocks * 256), noisy(blocks * 256);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-64, 64);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : exact) v = small(rng) / 8.0f;  // sums are exact in float
  for (auto& v : noisy) v = u(rng);
  std::vector<float> first;
  for (int host_threads : {1, 2, 5}) {
    Runtime rt(host_threads);
    for (int warp : {32, 64}) {
      std::vector<float> out(blocks), out_noisy(blocks);
      auto run = [&](const float* x, float* o) {
        if (warp == 32)
          launch<32>(CT_KERNEL(tree_sum), dim3(blocks), dim3(256), 0, &rt, x, o);
        else
          launch<64>(CT_KERNEL(tree_sum), dim3(blocks), dim3(256), 0, &rt, x, o);
      };
      run(exact.data(), out.data());
      run(noisy.data(), out_noisy.data());
      for (int b = 0; b < blocks; ++b) {
        float seq = 0;
        for (int i = 0; i < 256; ++i) seq += exact[b * 256 + i];
        ASSERT_EQ(out[b], seq) << "block " << b;
        double ref = 0;
        for (int i = 0; i < 256; ++i) ref += noisy[b * 256 + i];
        ASSERT_NEAR(out_noisy[b], ref, 1e-4) << "block " << b;
      }
      if (first.empty()) first = out_noisy;
      ASSERT_EQ(0, std::memcmp(first.data(), out_noisy.data(), blocks * sizeof(float)))
          << "warp " << warp << ", " << host_threads << " host threads";
    }
  }
}

TEST(SimtRuntime, BarriersOrderAPrefixScanOverFullSizeBlocks) {
  Runtime rt(3);
  for (unsigned threads : {1024u, 1000u, 33u}) {
    const unsigned blocks = 5;
    std::vector<int> x(blocks * threads), out(blocks * threads), want(blocks * threads);
    std::mt19937 rng(threads);
    for (auto& v : x) v = static_cast<int>(rng() % 100) - 50;
    for (unsigned b = 0; b < blocks; ++b)
      std::partial_sum(x.begin() + b * threads, x.begin() + (b + 1) * threads,
                       want.begin() + b * threads);
    launch<64>(CT_KERNEL(block_scan), dim3(blocks), dim3(threads), threads * sizeof(int), &rt,
               x.data(), out.data());
    EXPECT_EQ(out, want) << threads << " threads";
    launch<32>(CT_KERNEL(block_scan), dim3(blocks), dim3(threads), threads * sizeof(int), &rt,
               x.data(), out.data());
    EXPECT_EQ(out, want) << threads << " threads";
  }
}

// The schedule (simt.cpp, Block::next_ready): between two barriers one warp runs all its code,
// collectives included, before the next starts; warps ascending in blocks whose x + y + z is even,
// descending in the others, from the order's first after every barrier. So every warp's 2 WARP
// passes of a phase come together, in that order, in both phases.
TEST(SimtRuntime, WarpsRunOneAtATimeBetweenBarriersInTheBlocksOrder) {
  Runtime rt(2);
  auto check = [&](int warp, auto launch_it) {
    const int threads = 4 * warp, blocks = 3;
    std::vector<int> out(blocks * 4 * threads, -1);
    launch_it(out.data(), blocks, threads);
    for (int b = 0; b < blocks; ++b)
      for (int i = 0; i < 4 * threads; ++i) {
        const int pos = i % (2 * threads) / (2 * warp);  // the warp's place in the phase
        const int want = b % 2 == 0 ? pos : 3 - pos;
        ASSERT_EQ(out[b * 4 * threads + i], want)
            << "warp " << warp << ", block " << b << ", pass " << i << " of the block";
      }
  };
  check(32, [&](int* o, int blocks, int threads) {
    launch<32>(CT_KERNEL(schedule_order<32>), dim3(blocks), dim3(threads), 0, &rt, o);
  });
  check(64, [&](int* o, int blocks, int threads) {
    launch<64>(CT_KERNEL(schedule_order<64>), dim3(blocks), dim3(threads), 0, &rt, o);
  });
}

TEST(SimtRuntime, DivergentLanesReconvergeForAShuffle) {
  Runtime rt(2);
  for (int warp : {32, 64}) {
    std::vector<int> out(96, -1);
    if (warp == 32)
      launch<32>(CT_KERNEL(divergent<32>), dim3(1), dim3(96), 0, &rt, out.data());
    else
      launch<64>(CT_KERNEL(divergent<64>), dim3(1), dim3(96), 0, &rt, out.data());
    for (int t = 0; t < 96; ++t) EXPECT_EQ(out[t], 2 * (t ^ 1)) << "warp " << warp << " lane " << t;
  }
}

TEST(SimtRuntime, ShuffleWidth32InsideA64WideWarp) {
  Runtime rt(1);
  std::vector<int> in(4 * 64), out(4 * 64);
  for (int i = 0; i < 4 * 64; ++i) in[i] = i % 64;  // every lane holds its lane id
  launch<64>(CT_KERNEL(shuffles<64>), dim3(1), dim3(64), 0, &rt, in.data(), out.data(), 1, 32);
  EXPECT_EQ(out[30], 31);  // down: within the first half
  EXPECT_EQ(out[31], 31);  // down: lane 32 is another segment, keeps its own
  EXPECT_EQ(out[32], 33);  // down: the second half reads within itself
  EXPECT_EQ(out[63], 63);
  EXPECT_EQ(out[64 + 32], 32);  // up: lane 32 may not read lane 31
  EXPECT_EQ(out[64 + 33], 32);
  EXPECT_EQ(out[128 + 31], 30);  // xor 1
  EXPECT_EQ(out[192 + 0], 1);    // idx 1 + 0 within segment 0
  EXPECT_EQ(out[192 + 34], 34);  // idx 1 + (34 % 3 = 1) = 2 in segment 1: lane 34
  launch<64>(CT_KERNEL(shuffles<64>), dim3(1), dim3(64), 0, &rt, in.data(), out.data(), 37, 32);
  EXPECT_EQ(out[192 + 0], 5);    // idx 37 wraps to 5 in segment 0
  EXPECT_EQ(out[192 + 33], 37);  // idx 37 + (33 % 3 = 0) wraps to 5 in segment 1: lane 37
  launch<64>(CT_KERNEL(shuffles<64>), dim3(1), dim3(64), 0, &rt, in.data(), out.data(), 16, 16);
  EXPECT_EQ(out[128 + 0], 0);   // xor 16 at width 16: a later segment, keeps its own
  EXPECT_EQ(out[128 + 16], 0);  // ... an earlier segment is read
  EXPECT_EQ(out[128 + 48], 32);
}

TEST(SimtRuntime, ShufflesFollowCudasWidthRulesAtWarp32And64) {
  Runtime rt(2);
  for (int threads : {64, 128, 96, 80}) {  // 80: a partial last warp at both sizes
    for (int width : {1, 2, 4, 8, 16, 32})
      for (int arg : {0, 1, 3, 8, 16, 31})
        ASSERT_NO_FATAL_FAILURE(check_shuffles<32>(rt, threads, arg, width));
    for (int width : {1, 8, 16, 32, 64})
      for (int arg : {0, 1, 5, 16, 32, 33, 63})
        ASSERT_NO_FATAL_FAILURE(check_shuffles<64>(rt, threads, arg, width));
  }
}

TEST(SimtRuntime, ShuffleRejectsAWidthThatIsNoPowerOfTwoOrWiderThanTheWarp) {
  Runtime rt(1);
  std::vector<int> in(4 * 64), out(4 * 64);
  EXPECT_NE(error_of([&] {
              launch<32>(CT_KERNEL(shuffles<32>), dim3(1), dim3(64), 0, &rt, in.data(), out.data(),
                         1, 64);
            }).find("width 64"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              launch<64>(CT_KERNEL(shuffles<64>), dim3(1), dim3(64), 0, &rt, in.data(), out.data(),
                         1, 12);
            }).find("not a power of two"),
            std::string::npos);
}

TEST(SimtRuntime, VotesCoverTheWarpAndOnlyItsLanes) {
  Runtime rt(1);
  for (int warp : {32, 64})
    for (int threads : {64, 48, 128}) {
      std::vector<unsigned long long> out(threads * 4);
      if (warp == 32)
        launch<32>(CT_KERNEL(votes<32>), dim3(1), dim3(threads), 0, &rt, out.data());
      else
        launch<64>(CT_KERNEL(votes<64>), dim3(1), dim3(threads), 0, &rt, out.data());
      for (int t = 0; t < threads; ++t) {
        const int w0 = t / warp * warp, members = std::min(warp, threads - w0);
        unsigned long long ballot = 0;
        for (int l = 0; l < members; ++l)
          if ((w0 + l) % 3 == 0) ballot |= 1ull << l;
        EXPECT_EQ(out[t * 4 + 0], ballot) << warp << " " << threads << " " << t;
        EXPECT_EQ(out[t * 4 + 1], (5 >= w0 && 5 < w0 + members) ? 1u : 0u);
        EXPECT_EQ(out[t * 4 + 2], 1u);
        EXPECT_EQ(out[t * 4 + 3], (7 >= w0 && 7 < w0 + members) ? 0u : 1u);
      }
    }
}

TEST(SimtRuntime, SharedMemoryIsPerBlockAndFreshEveryBlock) {
  const int blocks = 50, threads = 128;
  std::vector<unsigned> want(blocks * threads);
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) {
      const unsigned u = (t + 1) % threads, a = b * 1000 + u, bb = b * 7 + u * 3;
      want[b * threads + t] = a * 2 + bb + (a + bb);
    }
  for (int host_threads : {1, 3}) {
    Runtime rt(host_threads);
    std::vector<unsigned> out(blocks * threads);
    unsigned stale = 0;
    launch<32>(CT_KERNEL(shared_per_block), dim3(blocks), dim3(threads), threads * sizeof(unsigned),
               &rt, out.data(), &stale);
    EXPECT_EQ(stale, 0u) << host_threads << " host threads";
    EXPECT_EQ(out, want) << host_threads << " host threads";
  }
}

TEST(SimtRuntime, AtomicsFromManyBlocksOnManyHostThreads) {
  Runtime rt(4);
  const int blocks = 300, threads = 128;
  int counters[3] = {0, -1, 0};
  float fsum = 0;
  launch<32>(CT_KERNEL(atomics), dim3(blocks), dim3(threads), 0, &rt, counters, &fsum);
  EXPECT_EQ(counters[0], blocks * threads);
  EXPECT_EQ(counters[1], blocks * threads - 1);
  EXPECT_EQ(counters[2], blocks * threads);
  EXPECT_EQ(fsum, static_cast<float>(blocks * threads));  // ones: exact in any order
}

TEST(SimtRuntime, OddOneTwoAndThreeDimensionalGeometry) {
  Runtime rt(3);
  const dim3 grids[] = {dim3(13), dim3(5, 3), dim3(3, 5, 2)};
  const dim3 block_shapes[] = {dim3(37), dim3(7, 9), dim3(7, 3, 2)};
  for (int i = 0; i < 3; ++i) {
    const dim3 g = grids[i], b = block_shapes[i];
    const int total = static_cast<int>(g.x * g.y * g.z * b.x * b.y * b.z);
    std::vector<int> out(total, 0);
    int bad = 0;
    launch<32>(CT_KERNEL(geometry), g, b, 0, &rt, out.data(), &bad);
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(std::count(out.begin(), out.end(), 1), total) << "shape " << i;
  }
}

// A GPU refuses a block over the kernel's __launch_bounds__; so does the runtime, before any thread
// of the launch runs, naming kernel, block and bound.
template <int WARP>
void check_launch_bounds_at_warp() {
  Runtime rt(3);
  const unsigned grid = 5;
  for (const dim3 block : {dim3(2 * WARP), dim3(WARP / 2, 4), dim3(1), dim3(WARP + 3)}) {
    const unsigned threads = block.x * block.y;
    std::vector<int> out(grid * threads, 0);
    launch<WARP>(CT_KERNEL(bounded<WARP>), dim3(grid), block, 0, &rt, out.data());
    EXPECT_EQ(std::count(out.begin(), out.end(), 1), static_cast<long>(out.size()))
        << "warp " << WARP << " block " << block.x << "x" << block.y;
  }
  for (const dim3 block : {dim3(2 * WARP + 1), dim3(WARP, 3), dim3(1024)}) {
    std::vector<int> out(grid * block.x * block.y, 0);
    const std::string e = error_of(
        [&] { launch<WARP>(CT_KERNEL(bounded<WARP>), dim3(grid), block, 0, &rt, out.data()); });
    std::ostringstream expect;
    expect << "simt: launch of bounded<WARP>: block (" << block.x << "," << block.y << ",1) has "
           << block.x * block.y
           << " threads, over the kernel's CT_LAUNCH_BOUNDS(2 * WARP) = " << 2 * WARP;
    EXPECT_EQ(e, expect.str());
    EXPECT_EQ(std::count(out.begin(), out.end(), 0), static_cast<long>(out.size()))
        << "a refused launch ran, " << e;
  }
}

TEST(SimtRuntime, LaunchBoundsAdmitBlocksUpToTheBoundAndRefuseLarger) {
  check_launch_bounds_at_warp<32>();
  check_launch_bounds_at_warp<64>();
}

TEST(SimtRuntime, KernelErrorsNameKernelAndBlockInsteadOfHanging) {
  Runtime rt(2);
  std::vector<int> out(64);
  std::string e =
      error_of([&] { launch<32>(CT_KERNEL(early_return), dim3(3), dim3(64), 0, &rt, out.data()); });
  EXPECT_NE(e.find("early_return"), std::string::npos) << e;
  EXPECT_NE(e.find("block ("), std::string::npos) << e;
  EXPECT_NE(e.find("returned"), std::string::npos) << e;

  e = error_of(
      [&] { launch<32>(CT_KERNEL(split_barriers), dim3(2), dim3(64), 0, &rt, out.data()); });
  EXPECT_NE(e.find("different"), std::string::npos) << e;

  e = error_of([&] {
    launch<32>(CT_KERNEL(barrier_vs_shuffle<32>), dim3(1), dim3(32), 0, &rt, out.data());
  });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("shfl_down"), std::string::npos) << e;

  e = error_of(
      [&] { launch<64>(CT_KERNEL(mixed_collectives<64>), dim3(1), dim3(64), 0, &rt, out.data()); });
  EXPECT_NE(e.find("while its warp waits at"), std::string::npos) << e;

  e = error_of([&] {
    launch<32>(CT_KERNEL(too_much_static_shared), dim3(1), dim3(64), 0, &rt, out.data());
  });
  EXPECT_NE(e.find("static shared memory"), std::string::npos) << e;

  e = error_of(
      [&] { launch<32>(CT_KERNEL(throws_in_kernel), dim3(4), dim3(64), 0, &rt, out.data()); });
  EXPECT_EQ(e, "kernel says no");

  e = error_of(
      [&] { launch<32>(CT_KERNEL(early_return), dim3(1), dim3(1025), 0, &rt, out.data()); });
  EXPECT_NE(e.find("1024"), std::string::npos) << e;

  // The runtime is usable after errors.
  std::vector<float> x(256, 0.5f);
  float sum = 0;
  launch<32>(CT_KERNEL(tree_sum), dim3(1), dim3(256), 0, &rt, x.data(), &sum);
  EXPECT_EQ(sum, 128.0f);
}

// Capture, CUDA's stream capture: launches on a capturing stream are checked and recorded with
// their arguments (by value), not run; running the nodes replays them, in order. A stream over
// another's host threads captures on its own: the other runs its launches as ever.
TEST(SimtRuntime, CaptureRecordsLaunchesWithTheirArgumentsAndStreamsCaptureApart) {
  Runtime pool(2);
  Runtime stream(&pool);
  EXPECT_EQ(stream.threads(), 2);
  std::vector<float> x(512, 0.25f), y(512, 1.0f);
  float sums[2] = {-1, -1}, other = -1;
  std::vector<Runtime::Node> graph;
  stream.begin_capture(&graph);
  float* target = &sums[0];
  launch<32>(CT_KERNEL(tree_sum), dim3(2), dim3(256), 0, &stream, x.data(), target);
  target = nullptr;  // the recorded launch keeps the pointer it was given
  launch<32>(CT_KERNEL(tree_sum), dim3(1), dim3(256), 0, &pool, y.data(), &other);  // runs now
  std::string e = error_of([&] {  // checked when recorded, as a GPU checks the launch
    launch<32>(CT_KERNEL(tree_sum), dim3(1), dim3(2048), 0, &stream, x.data(), &sums[0]);
  });
  EXPECT_NE(e.find("more than 1024 threads"), std::string::npos) << e;
  stream.end_capture();
  EXPECT_EQ(graph.size(), 1u);
  EXPECT_EQ(other, 256.0f);
  EXPECT_EQ(sums[0], -1.0f) << "a captured launch ran";
  for (const Runtime::Node& node : graph) node();
  EXPECT_EQ(sums[0], 64.0f);
  EXPECT_EQ(sums[1], 64.0f);
  std::fill(x.begin(), x.end(), 0.5f);  // a replay reads the memory as it is then
  for (const Runtime::Node& node : graph) node();
  EXPECT_EQ(sums[0], 128.0f);
  EXPECT_EQ(sums[1], 128.0f);
}

}  // namespace
