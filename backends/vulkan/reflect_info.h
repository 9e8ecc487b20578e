// What the build learns from each shader variant's SPIR-V (see cmake/ct_vk_reflect.cmake), and
// the compile-time check that a C++ push-constant struct matches the shader's block.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ct::vk {

struct ReflectInfo {
  uint32_t binding_mask;  // bit b set: set 0, binding b is a storage buffer
  uint32_t num_bindings;
  uint32_t push_size;  // bytes of the push-constant block (0: none)
  uint32_t push_members;
  uint32_t local_size[3];         // 0 where the size is a specialization constant
  int32_t local_size_spec_id[3];  // -1 where the size is a literal
  uint32_t readonly_mask;         // bit b set: binding b is declared readonly (never written)
};

}  // namespace ct::vk

// CT_VK_PUSH_SIZE(Struct, variant): the struct is exactly the shader's push-constant block.
#define CT_VK_PUSH_SIZE(S, V)                              \
  static_assert(sizeof(S) == ::ct::vk::refl::V::kPushSize, \
                #S " does not match the push-constant block of " #V)
// CT_VK_PUSH_MEMBER(Struct, variant, member): member sits at the shader's offset.
#define CT_VK_PUSH_MEMBER(S, V, m)                            \
  static_assert(offsetof(S, m) == ::ct::vk::refl::V::push::m, \
                #S "::" #m " is not at the offset the shader " #V " reads")
