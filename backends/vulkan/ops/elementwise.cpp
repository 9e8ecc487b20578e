// fill, copy (with f32/f16/bf16 conversion), add, accumulate, scale.
// Shaders: fill.comp, convert.comp, add.comp, scale.comp.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct FillPush {
  uint32_t n, off, bits;
};
CT_VK_PUSH_SIZE(FillPush, fill_b32);
CT_VK_PUSH_MEMBER(FillPush, fill_b32, n);
CT_VK_PUSH_MEMBER(FillPush, fill_b32, off);
CT_VK_PUSH_MEMBER(FillPush, fill_b32, bits);

struct ConvertPush {
  uint32_t n, od, os;
};
CT_VK_PUSH_SIZE(ConvertPush, convert_f32_bf16);
CT_VK_PUSH_MEMBER(ConvertPush, convert_f32_bf16, n);
CT_VK_PUSH_MEMBER(ConvertPush, convert_f32_bf16, od);
CT_VK_PUSH_MEMBER(ConvertPush, convert_f32_bf16, os);

struct AddPush {
  uint32_t n, oo, oa, ob;
};
CT_VK_PUSH_SIZE(AddPush, add);
CT_VK_PUSH_MEMBER(AddPush, add, n);
CT_VK_PUSH_MEMBER(AddPush, add, oo);
CT_VK_PUSH_MEMBER(AddPush, add, oa);
CT_VK_PUSH_MEMBER(AddPush, add, ob);
CT_VK_PUSH_SIZE(AddPush, add_f16);
CT_VK_PUSH_SIZE(AddPush, add_bf16);

struct ScalePush {
  uint32_t n, off;
  float s;
};
CT_VK_PUSH_SIZE(ScalePush, scale);
CT_VK_PUSH_MEMBER(ScalePush, scale, n);
CT_VK_PUSH_MEMBER(ScalePush, scale, off);
CT_VK_PUSH_MEMBER(ScalePush, scale, s);

static constexpr uint32_t kLocal = 256;

// Integers take the value truncated toward zero, saturated to the type's range (NaN -> 0).
template <class I>
static I saturate(float v, float lo, float hi) {
  if (!(v == v)) return 0;
  if (v <= lo) return static_cast<I>(lo);
  if (v >= hi) return static_cast<I>(hi);
  return static_cast<I>(v);
}

void VulkanDevice::fill_kernel(const Tensor& t, float value) {
  uint32_t bits = 0;
  ShaderId id = ShaderId::fill_b32;
  switch (t.dtype) {
    case DType::f32:
      bits = f32_bits(value);
      break;
    case DType::i32:
      // 2147483520 is the largest float below 2^31.
      bits = static_cast<uint32_t>(saturate<int32_t>(value, -2147483648.f, 2147483520.f));
      break;
    case DType::f16:
      bits = f32_to_f16(value);
      id = ShaderId::fill_b16;
      break;
    case DType::bf16:
      bits = f32_to_bf16(value);
      id = ShaderId::fill_b16;
      break;
    case DType::i8:
      bits = static_cast<uint8_t>(saturate<int8_t>(value, -128.f, 127.f));
      id = ShaderId::fill_b8;
      break;
    case DType::u8:
      bits = saturate<uint8_t>(value, 0.f, 255.f);
      id = ShaderId::fill_b8;
      break;
  }
  for_each_chunk(*this, t.numel(), dtype_size(t.dtype), [&](int64_t s, int64_t n) {
    Bound b = bind(t, s, n);
    auto g = grid(n, kLocal);
    dispatch(id, {b}, FillPush{u32(n), b.first, bits}, g[0], g[1]);
  });
}

static ShaderId convert_shader(DType src, DType dst) {
  using D = DType;
  if (src == D::f32 && dst == D::f16) return ShaderId::convert_f32_f16;
  if (src == D::f32 && dst == D::bf16) return ShaderId::convert_f32_bf16;
  if (src == D::f16 && dst == D::f32) return ShaderId::convert_f16_f32;
  if (src == D::f16 && dst == D::bf16) return ShaderId::convert_f16_bf16;
  if (src == D::bf16 && dst == D::f32) return ShaderId::convert_bf16_f32;
  if (src == D::bf16 && dst == D::f16) return ShaderId::convert_bf16_f16;
  fail(ErrorKind::kUnsupported,
       std::string("copy: no conversion from ") + dtype_name(src) + " to " + dtype_name(dst));
}

void VulkanDevice::copy_kernel(const Tensor& dst, const Tensor& src) {
  if (dst.dtype == src.dtype) {
    // A same-dtype copy may overlap its source (a memmove); vkCmdCopyBuffer regions must not.
    if (dst.buffer == src.buffer && dst.offset < src.offset + src.nbytes() &&
        src.offset < dst.offset + dst.nbytes()) {
      Tensor tmp = workspace(src.shape, src.dtype);
      copy_bytes(tmp, src);
      copy_bytes(dst, tmp);
      return;
    }
    copy_bytes(dst, src);
    return;
  }
  ShaderId id = convert_shader(src.dtype, dst.dtype);
  for_each_chunk(*this, dst.numel(), 4, [&](int64_t s, int64_t n) {
    Bound bd = bind(dst, s, n), bs = bind(src, s, n);
    auto g = grid(n, kLocal);
    dispatch(id, {bd, bs}, ConvertPush{u32(n), bd.first, bs.first}, g[0], g[1]);
  });
}

static void add_impl(VulkanDevice& dev, const Tensor& out, const Tensor& a, const Tensor& b) {
  for_each_chunk(dev, out.numel(), 4, [&](int64_t s, int64_t n) {
    Bound bo = dev.bind(out, s, n), ba = dev.bind(a, s, n), bb = dev.bind(b, s, n);
    auto g = dev.grid(n, kLocal);
    dev.dispatch(h_variant(b.dtype, ShaderId::add, ShaderId::add_f16, ShaderId::add_bf16),
                 {bo, ba, bb}, AddPush{u32(n), bo.first, ba.first, bb.first}, g[0], g[1]);
  });
}

void VulkanDevice::add_kernel(const Tensor& out, const Tensor& a, const Tensor& b) {
  add_impl(*this, out, a, b);
}

void VulkanDevice::accumulate_kernel(const Tensor& dst, const Tensor& src) {
  add_impl(*this, dst, dst, src);
}

void VulkanDevice::scale_kernel(const Tensor& t, float s) {
  for_each_chunk(*this, t.numel(), 4, [&](int64_t st, int64_t n) {
    Bound b = bind(t, st, n);
    auto g = grid(n, kLocal);
    dispatch(ShaderId::scale, {b}, ScalePush{u32(n), b.first, s}, g[0], g[1]);
  });
}

}  // namespace ct::vk
