#!/usr/bin/env bash
# The whole test suite once more, built with AddressSanitizer + UndefinedBehaviorSanitizer
# (CMake preset debug-asan: -O1 -g, build-asan/). Run after scripts/setup.sh, which installs the
# packages; CI runs it after the README's test command.
#
# Any ASan error or UBSan "runtime error" fails the test that hit it (halt_on_error/abort, see
# the debug-asan test preset). Leak checking is off: libdnnl keeps its primitive caches and
# Mesa/LLVM their JIT state until exit by design (all 80 leak reports of a first run were inside
# libdnnl, libvulkan or JIT code), and LeakSanitizer's tracer crashes (SIGSEGV) on this VM for
# processes that ran lavapipe's threads.
#
# Left out here (the release run has them): the CUDA and HIP plugins (built and compiled there;
# they cannot run on these machines) and the end-to-end training runs on the simt backends
# (test preset filter: TrainParity / GPT2Golden / FusedAttentionTraining on simt*, TrainChain)
# -- minutes of fiber switching under ASan that add nothing the simt op suites under ASan do
# not check -- and the nvcc / hipcc compile checks of the kernel sources (the release build
# compiles the plugins).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cmake --preset debug-asan >/dev/null
# The build runs the test executables to list their cases (gtest_discover_tests); the device
# suites open every registered backend while listing, so the same sanitizer options as the test
# preset apply there too (LeakSanitizer off, for the reasons above).
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  cmake --build --preset debug-asan
ctest --preset debug-asan
