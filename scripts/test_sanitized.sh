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
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cmake --preset debug-asan >/dev/null
cmake --build --preset debug-asan
ctest --preset debug-asan
