#!/bin/sh
# Usage: check_isa_isolation.sh OBJDUMP FILE...
# Fails when a function in FILE uses AVX (ymm) or AVX-512 (zmm) registers outside the fast CPU
# kernels' own levels: ct::cpu::fast::avx2 (ymm only) and ct::cpu::fast::avx512_bf16. Everything
# else ships built for the x86-64 baseline and must run on any x86-64 CPU.
objdump=$1
shift
status=0
for f in "$@"; do
  bad=$("$objdump" -d -C --no-show-raw-insn "$f" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
    /%zmm/ && fn !~ /ct::cpu::fast::avx512_bf16::/ { print "zmm in " fn; next }
    /%ymm/ && fn !~ /ct::cpu::fast::(avx2|avx512_bf16)::/ { print "ymm in " fn }' | sort -u)
  if [ -n "$bad" ]; then
    echo "$f:"
    echo "$bad" | head -20
    status=1
  else
    echo "$f: AVX only in its ISA levels"
  fi
done
exit $status
