// Storage of the tensors that core/device.h's mixed-precision table allows in 16 bits.
// Variants (cmake: ct_vk_shader_h): H_F16 or H_BF16 store such a tensor as uint16_t bits;
// without either it is plain float. Arithmetic stays fp32: h_load() widens exactly, h_store()
// rounds to nearest even with the bit arithmetic of common/convert.glsl -- the CPU's rounding,
// bit for bit, independent of the device's fp16 conversion rounding mode or denormal flushing
// (lavapipe: shaderDenormPreserveFloat16 = false). h_round(f) is h_load(h_store(f)) in fp32: f
// as a 16-bit element holds it (a matmul's bias for a 16-bit c). Needs only
// storageBuffer16BitAccess.
// Macros, because 16-bit types may only appear in buffer storage and conversions (no 16-bit
// function parameters). Include before any declaration (it enables an extension).
#if defined(H_F16) || defined(H_BF16)
#extension GL_EXT_shader_16bit_storage : require
#include "common/convert.glsl"
#define H_T uint16_t
#if defined(H_F16)
#define h_load(v) ct_f16_to_f32(uint(v))
#define h_store(f) uint16_t(ct_f32_to_f16(f))
#define h_round(f) ct_f16_to_f32(ct_f32_to_f16(f))
#else
#define h_load(v) ct_bf16_to_f32(uint(v))
#define h_store(f) uint16_t(ct_f32_to_bf16(f))
#define h_round(f) ct_bf16_to_f32(ct_f32_to_bf16(f))
#endif
#else
#define H_T float
#define h_load(v) (v)
#define h_store(f) (f)
#define h_round(f) (f)
#endif
