# cmake -DSPV=<module.spv> -DVAR=<array name> -DOUT=<file.inc> -P ct_vk_embed.cmake
# The SPIR-V module as a C++ array of its 32-bit words (the module is little-endian words on
# disk), for shader_binaries.cpp to include: what glslang's --vn writes, without compiling the
# shader a second time.
file(READ ${SPV} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR rem "${n} % 8")
if(n EQUAL 0 OR NOT rem EQUAL 0)
  message(FATAL_ERROR "${SPV}: not a SPIR-V module (${n} hex digits, not a whole number of words)")
endif()
string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1," words "${hex}")
# Eight words to a line.
string(REGEX REPLACE "((0x[0-9a-f]+,)(0x[0-9a-f]+,)(0x[0-9a-f]+,)(0x[0-9a-f]+,)(0x[0-9a-f]+,)(0x[0-9a-f]+,)(0x[0-9a-f]+,)(0x[0-9a-f]+,))"
       "\\1\n" words "${words}")
if(NOT words MATCHES "^0x07230203,")
  message(FATAL_ERROR "${SPV}: not a SPIR-V module (no magic number 0x07230203)")
endif()
file(WRITE ${OUT} "// ${SPV}, embedded by cmake/ct_vk_embed.cmake\nconst uint32_t ${VAR}[] = {\n${words}\n};\n")
