#version 450
// t[off + i] = bits, i < n; one variant per element width (BITS = 32, 16, 8).
#extension GL_GOOGLE_include_directive : require
#if BITS == 16
#extension GL_EXT_shader_16bit_storage : require
#define ELEM uint16_t
#elif BITS == 8
#extension GL_EXT_shader_8bit_storage : require
#define ELEM uint8_t
#else
#define ELEM uint
#endif
#include "common/index.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;
  uint off;
  uint bits;
} pc;
layout(std430, binding = 0) writeonly buffer Dst { ELEM dst[]; };

void main() {
  uint i = ct_linear_index();
  if (i < pc.n) dst[pc.off + i] = ELEM(pc.bits);
}
