#!/usr/bin/env python3
"""The loops of a shader in RADV's disassembly (RADV_DEBUG=shaders output on stdin or a file):
for each backward branch, its body's instructions, WMMA instructions, global/buffer loads,
LDS (ds_*) instructions and waits for all of them (s_waitcnt lgkmcnt(0)) -- the body once, inner loops included once (a loop's cost per trip is
its body when it has no inner loops; otherwise add each inner loop's body times its trips).

  RADV_DEBUG=shaders RADV_FORCE_FAMILY=navi31 VK_ICD_FILENAMES=.../radeon_icd.json \\
      build/bin/vk_shader_stats MODULE.spv:spec=...:sg=64:full 2>&1 | python3 scripts/radv_loops.py
"""
import re
import sys


def loops(text):
    lines = text.split("\n")
    if "disasm:" not in lines:
        return None
    instr, labels = [], {}
    for line in lines[lines.index("disasm:") + 1:]:
        t = line.split(";")[0].strip()
        if not t:
            if instr:
                break
            continue
        m = re.match(r"^(BB\d+):$", t)
        if m:
            labels[m.group(1)] = len(instr)
        else:
            instr.append(t)
    out = []
    for i, t in enumerate(instr):
        m = re.match(r"s_(?:cbranch_\w+|branch)\s+(BB\d+)$", t)
        if m and labels.get(m.group(1), len(instr)) <= i:
            body = instr[labels[m.group(1)]:i + 1]
            out.append((m.group(1), len(body), sum("wmma" in x for x in body),
                        sum(x.startswith(("global_load", "buffer_load")) for x in body),
                        sum(x.startswith("ds_") for x in body),
                        sum(x.startswith("s_waitcnt lgkmcnt(0)") for x in body)))
    return len(instr), out


def main():
    text = open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read()
    r = loops(text)
    if r is None:
        sys.exit("radv_loops: no 'disasm:' section (RADV_DEBUG=shaders?)")
    total, found = r
    print("instructions %d" % total)
    for label, n, wmma, gl, ds, waits in found:
        per = " (%.1f a WMMA)" % (n / wmma) if wmma else ""
        print("  loop at %s: %d instructions%s, %d WMMA, %d global loads, %d LDS, %d LDS waits" %
              (label, n, per, wmma, gl, ds, waits))


if __name__ == "__main__":
    main()
