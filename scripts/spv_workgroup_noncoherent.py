#!/usr/bin/env python3
"""Rewrites a SPIR-V module that uses the Vulkan memory model so that its workgroup (shared)
memory is synchronised by its barriers alone, not by every access.

Why: a GLSL shader with GL_KHR_cooperative_matrix must use the Vulkan memory model, and glslang
then makes every access to a `shared` variable coherent (GLSL's shared variables are implicitly
workgroupcoherent): each OpLoad carries MakePointerVisible and each OpStore MakePointerAvailable
at workgroup scope. Mesa's RADV (25.0, ACO) turns each of them into a wait for the LDS access to
complete, so every shared load and store of the coopmat GEMM and flash attention was serialised
(`bench/vk_shader_stats` with RADV_DEBUG=shaders: an `s_waitcnt lgkmcnt(0)` after nearly every
`ds_` instruction). The shaders never rely on per-access coherence: every exchange through shared
memory is ordered by a barrier (barrier(), or subgroupMemoryBarrierShared() + subgroupBarrier()
for a subgroup's own scratch). So this script
  - drops MakePointerAvailable / MakePointerVisible (and their scope operands) from OpLoad,
    OpStore, OpCooperativeMatrixLoadKHR and OpCooperativeMatrixStoreKHR on pointers into
    Workgroup variables (NonPrivatePointer stays: the accesses remain subject to the barriers'
    availability and visibility operations), and
  - adds MakeAvailable | MakeVisible to the memory semantics of every OpControlBarrier and
    OpMemoryBarrier whose semantics include WorkgroupMemory (a new OpUnsignedInt constant beside
    the old one), so that under the Vulkan memory model each barrier makes the workgroup's writes
    before it available and visible to the reads after it -- what the per-access operations did
    for the same pairs of accesses.
Atomics are left as they are. The result is what the GLSL450 memory model gives the emulated
builds (no per-access operations); spirv-val checks it afterwards (cmake/CtVulkanShaders.cmake).

  python3 scripts/spv_workgroup_noncoherent.py IN.spv OUT.spv      # OUT may be IN
Prints what it changed on stderr with --verbose.
"""
import struct
import sys

OP_MEMORY_MODEL = 14
OP_CONSTANT = 43
OP_VARIABLE = 59
OP_LOAD = 61
OP_STORE = 62
OP_ACCESS_CHAIN = 65
OP_IN_BOUNDS_ACCESS_CHAIN = 66
OP_PTR_ACCESS_CHAIN = 67
OP_COPY_OBJECT = 83
OP_CONTROL_BARRIER = 224
OP_MEMORY_BARRIER = 225
OP_COOPMAT_LOAD = 4457
OP_COOPMAT_STORE = 4458

SC_WORKGROUP = 4
MEMORY_MODEL_VULKAN = 3

# Memory operands with an extra operand, in operand order (lowest bit first).
MA_ALIGNED = 0x2
MA_MAKE_AVAILABLE = 0x8
MA_MAKE_VISIBLE = 0x10
MA_WITH_OPERAND = (MA_ALIGNED, MA_MAKE_AVAILABLE, MA_MAKE_VISIBLE)

SEM_WORKGROUP_MEMORY = 0x100
SEM_MAKE_AVAILABLE = 0x2000
SEM_MAKE_VISIBLE = 0x4000


def instructions(words):
    i = 5
    while i < len(words):
        wc = words[i] >> 16
        if wc == 0 or i + wc > len(words):
            raise ValueError("malformed SPIR-V: instruction at word %d" % i)
        yield i, words[i] & 0xFFFF, words[i:i + wc]
        i += wc


def strip_memory_operands(ins, at, drop):
    """ins[at] is a memory-operand mask: returns ins with the bits in `drop` and their extra
    operands removed (the mask word kept, even if 0)."""
    mask = ins[at]
    out = ins[:at + 1]
    k = at + 1
    for bit in MA_WITH_OPERAND:
        if mask & bit:
            if not bit & drop:
                out.append(ins[k])
            k += 1
    out.extend(ins[k:])
    out[at] = mask & ~drop
    out[0] = (len(out) << 16) | (out[0] & 0xFFFF)
    return out


def patch(words, log=None):
    if len(words) < 5 or words[0] != 0x07230203:
        raise ValueError("not a SPIR-V module (magic number)")
    bound = words[3]
    uses_vmm = any(op == OP_MEMORY_MODEL and ins[2] == MEMORY_MODEL_VULKAN
                   for _, op, ins in instructions(words))
    if not uses_vmm:
        return words, 0  # the GLSL450 model has no per-access operations to drop

    shared = set()  # ids of pointers into Workgroup memory
    consts = {}     # id -> (type id, value) of 32-bit scalar constants
    for _, op, ins in instructions(words):
        if op == OP_VARIABLE and ins[3] == SC_WORKGROUP:
            shared.add(ins[2])
        elif op in (OP_ACCESS_CHAIN, OP_IN_BOUNDS_ACCESS_CHAIN, OP_PTR_ACCESS_CHAIN,
                    OP_COPY_OBJECT) and ins[3] in shared:
            shared.add(ins[2])
        elif op == OP_CONSTANT and len(ins) == 4:
            consts[ins[2]] = (ins[1], ins[3])

    # The barriers' semantics constants to upgrade, each with the id of its new version.
    both = SEM_MAKE_AVAILABLE | SEM_MAKE_VISIBLE
    new_sem = {}
    for _, op, ins in instructions(words):
        if op in (OP_CONTROL_BARRIER, OP_MEMORY_BARRIER):
            sem = ins[3] if op == OP_CONTROL_BARRIER else ins[2]
            if sem not in consts:
                raise ValueError("barrier semantics %%%d is not a 32-bit constant" % sem)
            value = consts[sem][1]
            if value & SEM_WORKGROUP_MEMORY and value & both != both and sem not in new_sem:
                new_sem[sem] = bound
                bound += 1

    changes = 0
    out = words[:5]
    for _, op, ins in instructions(words):
        ins = list(ins)
        drop, at = 0, None
        if op == OP_LOAD and ins[3] in shared and len(ins) > 4:
            drop, at = MA_MAKE_VISIBLE, 4
        elif op == OP_STORE and ins[1] in shared and len(ins) > 3:
            drop, at = MA_MAKE_AVAILABLE, 3
        elif op == OP_COOPMAT_LOAD and ins[3] in shared and len(ins) > 6:
            drop, at = MA_MAKE_VISIBLE, 6   # type, result, pointer, layout, stride, mask
        elif op == OP_COOPMAT_STORE and ins[1] in shared and len(ins) > 5:
            drop, at = MA_MAKE_AVAILABLE, 5  # pointer, object, layout, stride, mask
        if at is not None and ins[at] & drop:
            ins = strip_memory_operands(ins, at, drop)
            changes += 1
        if op in (OP_CONTROL_BARRIER, OP_MEMORY_BARRIER):
            k = 3 if op == OP_CONTROL_BARRIER else 2  # the semantics <id>
            if ins[k] in new_sem:
                ins[k] = new_sem[ins[k]]
                changes += 1
        out.extend(ins)
        if op == OP_CONSTANT and len(ins) == 4 and ins[2] in new_sem:
            tid, value = consts[ins[2]]
            out.extend([(4 << 16) | OP_CONSTANT, tid, new_sem[ins[2]], value | both])
    out[3] = bound
    if log:
        log("%d accesses and barriers changed, %d semantics constants added" %
            (changes, len(new_sem)))
    return out, changes


def main(argv):
    args = [a for a in argv[1:] if a != "--verbose"]
    if len(args) != 2:
        sys.stderr.write(__doc__)
        return 2
    data = open(args[0], "rb").read()
    if len(data) % 4:
        sys.stderr.write("%s: not a whole number of words\n" % args[0])
        return 1
    words = list(struct.unpack("<%dI" % (len(data) // 4), data))
    try:
        out, _ = patch(words, (lambda m: sys.stderr.write("%s: %s\n" % (args[0], m)))
                       if "--verbose" in argv else None)
    except ValueError as e:
        sys.stderr.write("%s: %s\n" % (args[0], e))
        return 1
    with open(args[1], "wb") as f:
        f.write(struct.pack("<%dI" % len(out), *out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
