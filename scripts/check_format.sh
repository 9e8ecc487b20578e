#!/usr/bin/env bash
# Fails when a C++ file tracked by git is not formatted as .clang-format says (CI runs it first).
#   bash scripts/check_format.sh         # list the files that differ, exit 1 if any
#   bash scripts/check_format.sh --fix   # reformat them in place
# The formatter is Debian 12's clang-format 14 (scripts/setup.sh installs it); another major
# version formats some constructs differently, so the check names the version it ran.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fmt=${CLANG_FORMAT:-clang-format}
command -v "$fmt" >/dev/null || { echo "check_format: $fmt not found (apt-get install clang-format)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cc' '*.hpp' '*.cu' '*.cuh')
if [[ "${1:-}" == "--fix" ]]; then
  "$fmt" -i --style=file "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$fmt" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($("$fmt" --version)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "run: bash scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files clean ($("$fmt" --version))"
