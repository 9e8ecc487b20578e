#!/bin/sh
# Usage: run_at_isa_level.sh LEVEL CROSSTRAIN_BIN COMMAND [ARGS...]
# Runs COMMAND with CT_CPU_ISA=LEVEL (the fast CPU kernels of that instruction-set level). Exits
# 77, which ctest reports as skipped, when this CPU cannot run LEVEL, or when LEVEL is the best it
# supports: the plain test entries already run that one.
level=$1
crosstrain=$2
shift 2
if ! info=$(CT_CPU_ISA=$level "$crosstrain" devices 2>&1); then
  echo "skipped: $info"
  exit 77
fi
best="cpu kernels: $level (forced by CT_CPU_ISA; the CPU supports $level)"
if printf '%s\n' "$info" | grep -qF "$best"; then
  echo "skipped: $level is this CPU's best level, which the entries without CT_CPU_ISA run"
  exit 77
fi
printf '%s\n' "$info" | grep -m1 "cpu kernels:"
CT_CPU_ISA=$level exec "$@"
