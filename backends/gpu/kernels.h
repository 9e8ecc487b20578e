// Launchers of the kernels under backends/gpu/kernels, one block per file. Every launcher
// enqueues on `stream` and takes the warp size of the device it runs on (32 or 64).
#pragma once

#include <cstdint>

#include "backends/gpu/portability.h"

namespace ct::gpu {

// --- reduce.cu -------------------------------------------------------------------------------
// out[0] = sum of x[0..n); deterministic: the reduction tree depends on n only, not on the warp
// size, the device or the number of host threads. partial needs reduce_sum_partials(n) floats.
int reduce_sum_partials(std::int64_t n);
void reduce_sum_f32(int warp, const float* x, float* partial, float* out, std::int64_t n,
                    ct_stream_t stream);

}  // namespace ct::gpu
