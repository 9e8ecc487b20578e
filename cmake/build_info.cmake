# Writes OUT (ct_build_info.h: CT_GIT_COMMIT, CT_BUILD_TYPE) for the reports of `crosstrain bench
# --report`; rewritten only when its text changes, so an unchanged commit recompiles nothing.
#   cmake -DSRC=<source dir> -DOUT=<header> -DBUILD_TYPE=<type> -P build_info.cmake
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
endif()
set(text "#define CT_GIT_COMMIT \"${commit}\"\n#define CT_BUILD_TYPE \"${BUILD_TYPE}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
