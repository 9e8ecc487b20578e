#!/bin/sh
# Usage: run_at_isa_level.sh LEVEL CROSSTRAIN_BIN COMMAND [ARGS...]
# Runs COMMAND with CT_CPU_ISA=LEVEL (the fast CPU kernels of that instruction-set level). Exits
# 77, which ctest reports as skipped, when this CPU cannot run LEVEL. The best level runs too
# (forced through the switch), so every level the CPU has is exercised by name.
level=$1
crosstrain=$2
shift 2
if ! info=$(CT_CPU_ISA=$level "$crosstrain" devices 2>&1); then
  echo "skipped: $info"
  exit 77
fi
printf '%s\n' "$info" | grep -m1 "cpu kernels:"
CT_CPU_ISA=$level exec "$@"
