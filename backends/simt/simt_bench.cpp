// Measures the SIMT runtime: the cost of a fiber switch (at __syncthreads and at a shuffle) and
// the reduce kernel's throughput against a plain loop. Prints figures; asserts nothing.
//   simt_bench [host_threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
  int v = threadIdx.x;
  for (int r = 0; r < rounds; ++r) v += ct_shfl_xor(v, 1, 32);
  if (threadIdx.x == 0) sink[blockIdx.x] = v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int host_threads = argc > 1 ? std::atoi(argv[1]) : 0;
  ct::simt::Runtime one(1), many(host_threads);
  std::vector<int> sink(64);

  for (auto [name, kernel] :
       {std::pair{"__syncthreads", &barrier_loop}, std::pair{"shfl_xor", &shuffle_loop}}) {
    const int threads = 256;
    ct::gpu::launch<32>(ct::gpu::KernelRef{kernel, name}, dim3(1), dim3(threads), 0, &one, 10,
                        sink.data());
    auto t0 = std::chrono::steady_clock::now();
    ct::gpu::launch<32>(ct::gpu::KernelRef{kernel, name}, dim3(1), dim3(threads), 0, &one, kRounds,
                        sink.data());
    const double s = seconds_since(t0);
    // Every thread suspends once per round and is resumed once: two switches.
    std::printf("%-14s %6.1f ns per fiber switch (%d threads x %d rounds, one host thread)\n", name,
                s * 1e9 / (2.0 * threads * kRounds), threads, kRounds);
  }

  const std::int64_t n = std::int64_t{1} << 24;
  std::vector<float> x(n);
  for (std::int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f;
  std::vector<float> partial(ct::gpu::reduce_sum_partials(n));
  float out = 0;
  for (int warp : {32, 64}) {
    ct::gpu::reduce_sum_f32(warp, x.data(), partial.data(), &out, n, &many);
    auto t0 = std::chrono::steady_clock::now();
    const int reps = 5;
    for (int r = 0; r < reps; ++r)
      ct::gpu::reduce_sum_f32(warp, x.data(), partial.data(), &out, n, &many);
    const double s = seconds_since(t0) / reps;
    std::printf("reduce_sum_f32 simt warp %d: %7.2f GB/s (%d host threads, n = %lld, sum %.6g)\n",
                warp, n * 4 / s * 1e-9, many.threads(), static_cast<long long>(n), out);
  }
  auto t0 = std::chrono::steady_clock::now();
  float plain = 0;
  for (std::int64_t i = 0; i < n; ++i) plain += x[i];
  const double s = seconds_since(t0);
  std::printf("plain loop (one thread):   %7.2f GB/s (sum %.6g)\n", n * 4 / s * 1e-9, plain);
  return 0;
}
