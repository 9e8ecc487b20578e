// Measures the SIMT runtime: the cost of a fiber switch (at __syncthreads and at a shuffle), the
// reduce kernel's throughput against a plain loop, and the f32 GEMM's GFLOP/s (one host thread,
// the median of a few runs). Prints figures; asserts nothing.
//   simt_bench [host_threads] [gemm]   (gemm: only the GEMM figures)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "backends/gpu/kernels.h"
#include "backends/gpu/portability.h"

namespace {

constexpr int kRounds = 2000;

__global__ void barrier_loop(int rounds, int* sink) {
  int v = 0;
  for (int r = 0; r < rounds; ++r) {
    v += r;
    __syncthreads();
  }
  if (threadIdx.x == 0) sink[blockIdx.x] = v;
}

__global__ void shuffle_loop(int rounds, int* sink) {
  unsigned v = threadIdx.x;  // wraps: unsigned
  for (int r = 0; r < rounds; ++r) v += ct_shfl_xor(v, 1, 32);
  if (threadIdx.x == 0) sink[blockIdx.x] = static_cast<int>(v);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of the calling thread: what a one-host-thread launch costs, on a shared machine too.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const int host_threads = argc > 1 ? std::atoi(argv[1]) : 0;
  ct::simt::Runtime one(1), many(host_threads);
  std::vector<int> sink(64);
  const bool only_gemm = argc > 2 && std::string(argv[2]) == "gemm";

  for (auto [name, kernel] :
       {std::pair{"__syncthreads", &barrier_loop}, std::pair{"shfl_xor", &shuffle_loop}}) {
    if (only_gemm) break;
    const int threads = 256;
    ct::gpu::launch<32>(ct::gpu::KernelRef{kernel, name}, dim3(1), dim3(threads), 0, &one, 10,
                        sink.data());
    const double t0 = thread_seconds();
    ct::gpu::launch<32>(ct::gpu::KernelRef{kernel, name}, dim3(1), dim3(threads), 0, &one, kRounds,
                        sink.data());
    const double s = thread_seconds() - t0;
    // Every thread suspends once per round and is resumed once.
    std::printf("%-14s %6.1f ns per thread and round (%d threads x %d rounds, one host thread)\n",
                name, s * 1e9 / (1.0 * threads * kRounds), threads, kRounds);
  }

  const std::int64_t n = only_gemm ? 0 : std::int64_t{1} << 24;
  std::vector<float> x(n);
  for (std::int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f;
  std::vector<float> partial(ct::gpu::reduce_sum_partials(n));
  float out = 0;
  for (int warp : {32, 64}) {
    if (only_gemm) break;
    ct::gpu::reduce_sum_f32(warp, x.data(), partial.data(), &out, n, &many);
    auto t0 = std::chrono::steady_clock::now();
    const int reps = 5;
    for (int r = 0; r < reps; ++r)
      ct::gpu::reduce_sum_f32(warp, x.data(), partial.data(), &out, n, &many);
    const double s = seconds_since(t0) / reps;
    std::printf("reduce_sum_f32 simt warp %d: %7.2f GB/s (%d host threads, n = %lld, sum %.6g)\n",
                warp, n * 4 / s * 1e-9, many.threads(), static_cast<long long>(n), out);
  }
  if (!only_gemm) {
    auto t0 = std::chrono::steady_clock::now();
    float plain = 0;
    for (std::int64_t i = 0; i < n; ++i) plain += x[i];
    const double s = seconds_since(t0);
    std::printf("plain loop (one thread):   %7.2f GB/s (sum %.6g)\n", n * 4 / s * 1e-9, plain);
  }

  struct GemmShape {
    std::int64_t M, N, K;
    bool ta, tb;
  };
  for (const GemmShape& g :
       {GemmShape{256, 256, 256, false, false}, GemmShape{256, 256, 256, false, true},
        GemmShape{256, 256, 256, true, false}, GemmShape{512, 1152, 384, false, true}}) {
    std::vector<float> a(g.M * g.K), b(g.K * g.N), c(g.M * g.N);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 17) * 0.01f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 13) * 0.02f;
    ct::gpu::GemmArgs args;
    args.c = c.data();
    args.a = a.data();
    args.b = b.data();
    args.M = g.M;
    args.N = g.N;
    args.K = g.K;
    args.trans_a = g.ta;
    args.trans_b = g.tb;
    for (int warp : {32, 64}) {
      ct::gpu::Ctx cx;
      cx.warp = warp;
      cx.stream = &one;
      std::vector<double> t;
      for (int r = 0; r < 5; ++r) {
        const double t1 = thread_seconds();
        ct::gpu::gemm(cx, args);
        t.push_back(thread_seconds() - t1);
      }
      std::sort(t.begin(), t.end());
      std::printf(
          "gemm f32 %4lld x %4lld x %4lld %s%s warp %d: %6.2f GFLOP/s per CPU second (best of 5)\n",
          static_cast<long long>(g.M), static_cast<long long>(g.N), static_cast<long long>(g.K),
          g.ta ? "T" : "N", g.tb ? "T" : "N", warp, 2.0 * g.M * g.N * g.K / t[0] * 1e-9);
    }
  }
  return 0;
}
