// Deterministic workgroup sum: a fixed tree over shared memory, so the result depends only on
// the workgroup size, never on scheduling. Every invocation must call it (it has barriers).
// Needs: #define CT_WG <workgroup size, a power of two> before including.
shared float ct_red[CT_WG];

float ct_wg_sum(float v) {
  uint tid = gl_LocalInvocationID.x;
  ct_red[tid] = v;
  barrier();
  for (uint s = CT_WG / 2u; s > 0u; s >>= 1u) {
    if (tid < s) ct_red[tid] += ct_red[tid + s];
    barrier();
  }
  float r = ct_red[0];
  barrier();
  return r;
}

float ct_wg_max(float v) {
  uint tid = gl_LocalInvocationID.x;
  ct_red[tid] = v;
  barrier();
  for (uint s = CT_WG / 2u; s > 0u; s >>= 1u) {
    if (tid < s) ct_red[tid] = max(ct_red[tid], ct_red[tid + s]);
    barrier();
  }
  float r = ct_red[0];
  barrier();
  return r;
}
