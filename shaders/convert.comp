#version 450
// dst[od + i] = convert(src[os + i]), i < n, between f32, f16 and bf16 (SRC_*, DST_* defines).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_16bit_storage : require
#include "common/index.glsl"
#include "common/convert.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;
  uint od;
  uint os;
} pc;

#if defined(SRC_F32)
layout(std430, binding = 1) readonly buffer Src { float src[]; };
float load(uint i) { return src[i]; }
#elif defined(SRC_F16)
layout(std430, binding = 1) readonly buffer Src { uint16_t src[]; };
float load(uint i) { return ct_f16_to_f32(uint(src[i])); }
#else
layout(std430, binding = 1) readonly buffer Src { uint16_t src[]; };
float load(uint i) { return ct_bf16_to_f32(uint(src[i])); }
#endif

#if defined(DST_F32)
layout(std430, binding = 0) writeonly buffer Dst { float dst[]; };
void store(uint i, float v) { dst[i] = v; }
#elif defined(DST_F16)
layout(std430, binding = 0) writeonly buffer Dst { uint16_t dst[]; };
void store(uint i, float v) { dst[i] = uint16_t(ct_f32_to_f16(v)); }
#else
layout(std430, binding = 0) writeonly buffer Dst { uint16_t dst[]; };
void store(uint i, float v) { dst[i] = uint16_t(ct_f32_to_bf16(v)); }
#endif

void main() {
  uint i = ct_linear_index();
  if (i < pc.n) store(pc.od + i, load(pc.os + i));
}
