#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz/ and fuzzes the
# safetensors reader for SECONDS (default 60), starting from fuzz/corpus/safetensors.
#   bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-60}
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DCT_BUILD_FUZZERS=ON -DCT_BACKEND_VULKAN=OFF -DCT_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" >/dev/null
cmake --build build-fuzz --target safetensors_fuzz
work=$(mktemp -d)
cp fuzz/corpus/safetensors/* "$work/"
build-fuzz/bin/safetensors_fuzz -max_total_time="$seconds" -max_len=4096 "$work"
rm -rf "$work"
