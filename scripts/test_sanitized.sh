#!/usr/bin/env bash
# The test suite's host-code part once more, built with AddressSanitizer + UndefinedBehaviorSanitizer
# (CMake preset debug-asan: -O1 -g1, build-asan/; the host code without hot loops at -O0,
# CT_SANITIZE_HOST_OPT in CMakeLists.txt). Run after scripts/setup.sh, which installs the
# packages; CI runs it after the README's test command.
#
# Any ASan error or UBSan "runtime error" fails the test that hit it (halt_on_error/abort, see
# the debug-asan test preset). Leak checking is off: libdnnl keeps its primitive caches and
# Mesa/LLVM their JIT state until exit by design (all 80 leak reports of a first run were inside
# libdnnl, libvulkan or JIT code), and LeakSanitizer's tracer crashes (SIGSEGV) on this VM for
# processes that ran lavapipe's threads.
#
# What runs here is what sanitizers can find: memory and UB errors in host code. The release run
# (ctest in build/) runs every case; this one (test preset debug-asan, CMakePresets.json) runs all
# of test_core, test_io, test_train, test_tools, test_simt, test_dist (but the two device runs
# named below), the fuzz corpus, the op suites on cpu_0, simt_0 and simt64_0 (the CPU kernels at
# each ISA level, the SIMT runtime and every GPU kernel source executed by it), the models on
# cpu_0, and the Vulkan host code (device, memory, streams, range splitting, the GEMM planner, the
# coopmat gate, pipeline cache) through a small shader set. Left to the release run, with the
# reason:
#   - the op cases of the other Vulkan shaders (attention, flash attention, norms, optimizers,
#     the mixed-precision and ULP sweeps, ...) and test_vulkan's shader-variant sweeps and
#     training runs: their work is in lavapipe's JIT-compiled shaders, which ASan does not
#     instrument, and their host code is the same dispatch path the small set covers;
#   - the end-to-end model runs on simt/simt64/vulkan (TrainParity, GPT2Golden, LlamaGolden,
#     LoraTraining, FusedAttentionTraining), TrainChain and the data-parallel runs on lavapipe
#     and simt (DataParallel.VulkanOnLavapipe/SimtKernels): minutes of fiber switching or JIT
#     code under ASan repeating host paths the cpu_0 model cases, the cpu data-parallel cases
#     and the simt op suites cover;
#   - ReferenceGPT2Golden / ReferenceLlamaGolden: the reference device's kernels at model size
#     (169 s and 151 s at -O1 under ASan, nearly all in its matmul); the same kernels are the
#     oracle of every op case here, and the models' host code runs in the cpu_0 golden cases;
#   - the cuda_unavailable / hip_unavailable cases (they only report the skip) and the nvcc /
#     hipcc compile checks and the CUDA/HIP plugins (built and compiled by the release build);
#   - the benchmarks (CT_BUILD_BENCH=OFF: the release run checks vulkan_gemm_bench's products);
#   - Report.RoundsAlternateThePrecisionsAndGiveTheirRatioToFp32: six training runs and a report's
#     kernels (32 s under ASan) around a few lines of JSON arithmetic; the other Report cases run
#     the same report and merge host code here.
# -g1 (line tables, no variable info) is enough for the file:line of every report and builds
# faster than -g. The tests' own sources (fixtures, assertions) are compiled without the
# sanitizers and linked with them (tests/CMakeLists.txt): the code under test is what is
# instrumented, and instrumenting the harness made this build ~40 % longer.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The SPIR-V is compiled once per run: the release build's shaders (brought up to date first) are
# what this build embeds too (CT_VK_SHADERS_FROM; same sources, same tools, same modules). Without
# a release build this one compiles its own.
shaders_from=
if [ -f build/build.ninja ] && grep -q '^CT_BACKEND_VULKAN:BOOL=ON' build/CMakeCache.txt; then
  cmake --build build --target crosstrain_backend_vulkan >/dev/null
  shaders_from=$PWD/build/generated/vulkan
fi
cmake --preset debug-asan -DCT_VK_SHADERS_FROM="$shaders_from" >/dev/null
# The build runs the test executables to list their cases (gtest_discover_tests); the device
# suites open every registered backend while listing, so the same sanitizer options as the test
# preset apply there too (LeakSanitizer off, for the reasons above).
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  cmake --build --preset debug-asan
# ctest's log of this run (build-asan/Testing/Temporary/LastTest.log) is what
# scripts/ci_timings.py reads; the count of cases left to the release run is printed here.
ctest --preset debug-asan
