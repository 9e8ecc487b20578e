#!/usr/bin/env bash
# Packs the release build into one self-contained archive that runs on a machine without
# Debian's packages or a build (the GPU test machine: /work/shared/GPU.md), for
# `scripts/gpu-check.sh --bundle FILE`:
#   bash scripts/bundle.sh [OUT.tar.xz]        default: build/crosstrain-bundle.tar.xz
#   bash scripts/bundle.sh --no-compress DIR   the same tree written as a folder (tests: no xz)
#   --build-dir DIR                            the build to pack (default: build)
# The archive holds one folder, crosstrain-bundle/:
#   bundle.json   the manifest: format, backend ABI (core/device.h kBackendAbiVersion), git
#                 commit, build and bundle dates, the bundled libraries and every file
#   bin/          crosstrain, libcrosstrain_core.so, the backend plugins, test_ops, test_model,
#                 test_vulkan, device_gemm_bench; bin/test-data is tests/data (the tests look
#                 there first: tests/common/test_data_dir.h)
#   lib/          the shared libraries those need that a base Linux system lacks (OpenBLAS,
#                 gfortran, ICU, libcrypto, oneDNN, PCRE2, gomp, ... and the Vulkan loader);
#                 lib/glvnd: libglvnd and X11 for NVIDIA's Vulkan driver where the target lacks them
#   data/fortunes crosstrain's default training text (pass --data: its built-in path is Debian's)
#   scripts/      gpu-check.sh, torch_train.py, torch_gpt2.py, report_charts.py
# RUNPATHs are $ORIGIN-relative (patchelf): nothing needs LD_LIBRARY_PATH. Left to the target
# system: glibc (libc, libm, libdl, libpthread, librt, ld-linux), libstdc++, libgcc_s, and the GPU
# stack (libcuda, cuBLASLt -- dlopened, /usr/local/cuda/lib64 --, libnvidia-*, HIP/ROCm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
out=""
compress=1
while (($#)); do
  case "$1" in
    --no-compress) compress=0; out="${2:?bundle.sh: --no-compress needs a folder}"; shift 2 ;;
    --build-dir) build="$(cd "${2:?bundle.sh: --build-dir needs a folder}" && pwd)"; shift 2 ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "bundle.sh: unknown option '$1' (known: --no-compress DIR, --build-dir DIR)" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done
[ -n "$out" ] || out="$build/crosstrain-bundle.tar.xz"
die() { echo "bundle.sh: $*" >&2; exit 1; }

command -v patchelf >/dev/null || die "patchelf is missing (Debian: apt-get install patchelf; scripts/setup.sh installs it)"
bin="$build/bin"
required=(crosstrain libcrosstrain_core.so test_ops test_model device_gemm_bench)
optional=(test_vulkan)
missing=()
for f in "${required[@]}"; do [ -f "$bin/$f" ] || missing+=("$f"); done
((${#missing[@]} == 0)) || die "$bin lacks ${missing[*]}: build them first (cmake --build $build --target ${missing[*]/libcrosstrain_core.so/crosstrain_core})"
abi="$(sed -n 's/.*kBackendAbiVersion = \([0-9][0-9]*\);.*/\1/p' "$root/core/device.h")"
[ -n "$abi" ] || die "no 'kBackendAbiVersion = N;' in $root/core/device.h"

# ---- the tree ----------------------------------------------------------------------------------
if ((compress)); then
  stage="$(mktemp -d)"
  trap 'rm -rf "$stage"' EXIT
  top="$stage/crosstrain-bundle"
else
  if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -f "$out/bundle.json" ]; then
    die "'$out' exists, is not empty and is not a bundle: not overwriting it"
  fi
  rm -rf "$out"
  top="$out"
fi
mkdir -p "$top/bin" "$top/lib" "$top/data/fortunes" "$top/scripts"
for f in "${required[@]}"; do cp "$bin/$f" "$top/bin/"; done
for f in "${optional[@]}"; do [ -f "$bin/$f" ] && cp "$bin/$f" "$top/bin/"; done
plugins=()
for p in "$bin"/libcrosstrain_backend_*.so; do
  [ -f "$p" ] || continue
  cp "$p" "$top/bin/"
  plugins+=("$(basename "$p" .so | sed 's/^libcrosstrain_backend_//')")
done
cp -r "$root/tests/data" "$top/bin/test-data"
for f in gpu-check.sh torch_train.py torch_gpt2.py report_charts.py; do cp "$root/scripts/$f" "$top/scripts/"; done
# The default text as crosstrain reads the folder (core/data/text_dataset.cpp): regular files,
# not *.dat, not hidden, no symlinks.
fortunes=/usr/share/games/fortunes
[ -d "$fortunes" ] || die "$fortunes is missing (Debian's 'fortunes' package; scripts/setup.sh installs it)"
find "$fortunes" -maxdepth 1 -type f ! -name '*.dat' ! -name '.*' -exec cp {} "$top/data/fortunes/" \;

# ---- the libraries -----------------------------------------------------------------------------
# Left to the target: the base system, and the GPU stack (with whatever it needs in turn).
source "$(dirname "${BASH_SOURCE[0]}")/bundle_libs.sh"
# NAME's path as the dynamic linker finds it from FILE (ldd), or from the cache (dlopened).
resolve() {
  local file="$1" name="$2" p
  p="$(ldd "$file" 2>/dev/null | awk -v n="$name" '$1 == n && $2 == "=>" { print $3; exit }')"
  if [ -z "$p" ] || [ "$p" = "not" ]; then
    p="$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ { print $NF; exit }')"
  fi
  [ -n "$p" ] && [ -f "$p" ] && echo "$p"
}
declare -A bundled=()   # soname -> the system path it came from
queue=()
for f in "$top"/bin/*; do
  [ -f "$f" ] && head -c4 "$f" | grep -q $'\x7fELF' && queue+=("$f")
done
# Loaded with dlopen, so no DT_NEEDED names them: oneDNN (backends/cpu/onednn_matmul.cpp, from
# libcrosstrain_core.so) and the Vulkan loader (backends/vulkan/loader.cpp, from the plugin).
dlopened=(libdnnl.so.2)
[ -f "$top/bin/libcrosstrain_backend_vulkan.so" ] && dlopened+=(libvulkan.so.1)
for name in "${dlopened[@]}"; do
  p="$(resolve "$top/bin/libcrosstrain_core.so" "$name")" || die "$name (dlopened) is not installed here"
  cp -L "$p" "$top/lib/$name"
  bundled[$name]="$(readlink -f "$p")"
  queue+=("$top/lib/$name")
done
while ((${#queue[@]})); do
  f="${queue[0]}"
  queue=("${queue[@]:1}")
  for name in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    is_base "$name" && continue
    is_gpu_stack "$name" && continue
    [ -e "$top/bin/$name" ] && continue
    [ -n "${bundled[$name]:-}" ] && continue
    p="$(resolve "$f" "$name")" || die "$(basename "$f") needs $name, which is not installed here"
    cp -L "$p" "$top/lib/$name"
    bundled[$name]="$(readlink -f "$p")"
    queue+=("$top/lib/$name")
  done
done
# What NVIDIA's Vulkan driver (libGLX_nvidia.so.0, its ICD library) needs from libglvnd and X11,
# for GPU images that lack them (the H100 image of 2026-11-27 answered VK_ERROR_INCOMPATIBLE_DRIVER
# with the driver's manifest present): lib/glvnd/, which gpu-check.sh puts on the library path
# only where the system has no libGLdispatch.so.0 of its own.
mkdir -p "$top/lib/glvnd"
gqueue=()
for name in libGLdispatch.so.0 libGLX.so.0 libX11.so.6 libXext.so.6; do
  p="$(resolve "$top/bin/libcrosstrain_core.so" "$name")" || { echo "bundle.sh: $name is not installed here: the bundle's Vulkan on NVIDIA relies on the target's own" >&2; continue; }
  cp -L "$p" "$top/lib/glvnd/$name"
  bundled[$name]="$(readlink -f "$p")"
  gqueue+=("$top/lib/glvnd/$name")
done
while ((${#gqueue[@]})); do
  f="${gqueue[0]}"
  gqueue=("${gqueue[@]:1}")
  for name in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    is_base "$name" && continue
    [ -e "$top/lib/glvnd/$name" ] && continue
    p="$(resolve "$f" "$name")" || die "$(basename "$f") needs $name, which is not installed here"
    cp -L "$p" "$top/lib/glvnd/$name"
    bundled[$name]="$(readlink -f "$p")"
    gqueue+=("$top/lib/glvnd/$name")
  done
done
for f in "$top"/lib/glvnd/*; do
  chmod u+w "$f"
  patchelf --set-rpath '$ORIGIN' "$f"
done
for f in "$top"/bin/*; do
  [ -f "$f" ] && head -c4 "$f" | grep -q $'\x7fELF' && patchelf --set-rpath '$ORIGIN:$ORIGIN/../lib' "$f"
done
for f in "$top"/lib/*; do
  [ -f "$f" ] || continue
  chmod u+w "$f"
  patchelf --set-rpath '$ORIGIN' "$f"
done

# ---- the manifest ------------------------------------------------------------------------------
json_str() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }
package_of() {  # the Debian package (and version) a library came from, when dpkg knows it
  local p="$1" pkg
  pkg="$(dpkg -S "$p" 2>/dev/null || dpkg -S "${p#/usr}" 2>/dev/null || true)"
  pkg="${pkg%%:*}"
  [ -n "$pkg" ] && echo "$pkg $(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)"
}
commit="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
dirty=false
[ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] && dirty=true
{
  echo "{"
  echo "  \"format\": 1,"
  echo "  \"backend_abi\": $abi,"
  echo "  \"git_commit\": $(json_str "$commit"),"
  echo "  \"git_dirty\": $dirty,"
  echo "  \"build_date\": $(json_str "$(date -u -r "$bin/crosstrain" +%Y-%m-%dT%H:%M:%SZ)"),"
  echo "  \"bundle_date\": $(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)"),"
  echo "  \"build_type\": $(json_str "$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null)"),"
  echo "  \"built_on\": $(json_str "$(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(ldd --version | head -1)"),"
  echo "  \"backends\": [$(printf '"%s",' "${plugins[@]}" | sed 's/,$//')],"
  echo "  \"libraries\": ["
  first=1
  for name in $(printf '%s\n' "${!bundled[@]}" | sort); do
    ((first)) || echo ","
    first=0
    printf '    {"name": %s, "from": %s, "package": %s}' "$(json_str "$name")" \
      "$(json_str "${bundled[$name]}")" "$(json_str "$(package_of "${bundled[$name]}")")"
  done
  echo ""
  echo "  ],"
  echo "  \"files\": ["
  first=1
  while IFS= read -r rel; do
    ((first)) || echo ","
    first=0
    printf '    {"path": %s, "bytes": %d}' "$(json_str "$rel")" "$(stat -c %s "$top/$rel")"
  done < <(cd "$top" && find . -type f ! -name bundle.json | sed 's|^\./||' | sort)
  echo ""
  echo "  ]"
  echo "}"
} >"$top/bundle.json"

# Nothing may point back into the build or source tree.
for f in "$top"/bin/* "$top"/lib/*; do
  [ -f "$f" ] && head -c4 "$f" | grep -q $'\x7fELF' || continue
  rp="$(readelf -d "$f" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')"
  case "$rp" in
    '$ORIGIN'|'$ORIGIN:$ORIGIN/../lib') ;;
    *) die "$(basename "$f") has RUNPATH '$rp' after patchelf" ;;
  esac
done

if ((compress)); then
  mkdir -p "$(dirname "$out")"
  XZ_OPT="${XZ_OPT:--6 -T2}" tar -C "$stage" -cJf "$out.tmp" crosstrain-bundle
  mv "$out.tmp" "$out"
  echo "bundle.sh: $out ($(du -h "$out" | cut -f1), ${#bundled[@]} libraries, backends: ${plugins[*]}, ABI $abi)"
else
  echo "bundle.sh: $out ($(du -sh "$out" | cut -f1), ${#bundled[@]} libraries, backends: ${plugins[*]}, ABI $abi)"
fi
