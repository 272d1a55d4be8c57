# Use ccache when it is installed: LibTorch headers make every compile slow on two cores.
# The sloppiness settings let ccache cache translation units that use a precompiled header;
# the base dir makes paths relative, so two checkouts (git worktrees) share cache entries.
find_program(MANTISSA_CCACHE ccache)
if(MANTISSA_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(_launcher ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}"
      ${MANTISSA_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_launcher})
  message(STATUS "mantissa: compiling through ${MANTISSA_CCACHE}")
endif()
