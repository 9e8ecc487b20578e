// Row kernels of 32 invocations a row, 8 rows a workgroup of 256 (the GPU kernels' row32 form:
// backends/gpu/kernels/common.h): lane l of a row takes its elements l, l + 32, ... in that
// order, and the 32 lanes' values combine by a fixed tree (16, 8, 4, 2, 1) in shared memory --
// the same pairs as the GPU kernels' xor butterflies. No early return in such a shader: every
// invocation takes part in the barriers (a row past N is not `live`). layernorm.comp, rmsnorm.comp.
#define ROW_LANES 32u
#define ROWS_WG 8u
layout(local_size_x = 256) in;
shared float ct_rows[256];
shared uint ct_flag;
#define ROW_REDUCE(name, OP)                                         \
  float name(float v) {                                              \
    const uint t = gl_LocalInvocationID.x, l = t % ROW_LANES;        \
    ct_rows[t] = v;                                                  \
    barrier();                                                       \
    for (uint s = ROW_LANES / 2u; s > 0u; s >>= 1u) {                \
      if (l < s) ct_rows[t] = OP(ct_rows[t], ct_rows[t + s]);        \
      barrier();                                                     \
    }                                                                \
    const float r = ct_rows[t - l];                                  \
    barrier();                                                       \
    return r;                                                        \
  }
#define ROW_ADD(a, b) ((a) + (b))
ROW_REDUCE(row_sum, ROW_ADD)
ROW_REDUCE(row_max, max)
// Whether p holds for any invocation of the workgroup (every invocation calls it).
bool wg_any(bool p) {
  if (gl_LocalInvocationID.x == 0u) ct_flag = 0u;
  barrier();
  if (p) atomicOr(ct_flag, 1u);
  barrier();
  const bool r = ct_flag != 0u;
  barrier();
  return r;
}
