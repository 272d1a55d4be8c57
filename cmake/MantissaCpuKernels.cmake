# The CPU kernels (MANTISSA_CPU_KERNEL_SOURCES) and what they need from the build:
#
# - Each *_avx2.cpp / *_avx512.cpp is the same kernel compiled for one x86 instruction set, the
#   way ATen compiles its own kernels: CPU_CAPABILITY names the namespace ATen's Vectorized<>
#   lives in, CPU_CAPABILITY_<ISA> selects its intrinsics, -m flags let the compiler emit them.
#   The library calls the one at::get_cpu_capability() names, so a CPU without AVX512 never
#   runs AVX512 code. Elsewhere than x86-64 those files forward to the portable build.
# - at::parallel_for only runs in parallel in code compiled with OpenMP (ATen/ParallelOpenMP.h),
#   so these files get -fopenmp, and the library links the libgomp that LibTorch itself loads
#   (torch/lib/libgomp.so.1 in the PyPI wheel): one OpenMP runtime, one thread pool.
# - Contraction of a multiply and an add into an fma follows what each kernel copies. FusedAdamW
#   spells out the fmas ATen's AdamW uses, so its files get -ffp-contract=off (else results drift
#   from AdamW's). The GELU kernels repeat ATen's GELU expressions as written and get GCC's
#   default -ffp-contract=fast, which ATen's own kernels are built with, so the same pairs fuse.
# - No precompiled header: its flags (no -fopenmp, no -m) differ, and these files include only
#   the few ATen headers they need.
include_guard(GLOBAL)
include(CheckCXXCompilerFlag)

function(mantissa_add_cpu_kernels target)
  target_sources(${target} PRIVATE ${MANTISSA_CPU_KERNEL_SOURCES})
  set(_x86 OFF)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(_x86 ON)
  endif()

  set(_openmp_flag "")
  set(_openmp_lib "")
  # GNU only: clang's -fopenmp emits calls into LLVM's libomp (__kmpc_fork_call), which the
  # libgomp LibTorch loads does not provide, and a second OpenMP runtime is what we avoid. A
  # clang build (the asan preset) runs the fused CPU kernels on one thread.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    check_cxx_compiler_flag(-fopenmp MANTISSA_HAVE_FOPENMP)
    if(MANTISSA_HAVE_FOPENMP)
      set(_openmp_flag -fopenmp)
      if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1")
        set(_openmp_lib "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1")
      else()
        find_package(OpenMP COMPONENTS CXX)
        if(OpenMP_CXX_FOUND)
          set(_openmp_lib OpenMP::OpenMP_CXX)
        else()
          set(_openmp_flag "")
        endif()
      endif()
    endif()
  endif()
  if(_openmp_lib)
    target_link_libraries(${target} PRIVATE ${_openmp_lib})
  else()
    message(STATUS "mantissa: no OpenMP; the fused CPU kernels run on one thread")
  endif()

  foreach(_source IN LISTS MANTISSA_CPU_KERNEL_SOURCES)
    set(_options ${_openmp_flag})
    set(_definitions)
    if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
      if(_source MATCHES "gelu_cpu_")
        list(APPEND _options -ffp-contract=fast)
      else()
        list(APPEND _options -ffp-contract=off)
      endif()
    endif()
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # GCC 12 flags its own _mm512_undefined_ps() in avx512fintrin.h (clang has no such flag),
      # as "maybe" or, once amsgrad's masked max and sqrt are inlined, as certainly uninitialized.
      list(APPEND _options -Wno-maybe-uninitialized -Wno-uninitialized)
    endif()
    if(_source MATCHES "_default\\.cpp$")
      list(APPEND _definitions CPU_CAPABILITY=DEFAULT CPU_CAPABILITY_DEFAULT)
    elseif(_source MATCHES "_avx2\\.cpp$" AND _x86)
      list(APPEND _definitions CPU_CAPABILITY=AVX2 CPU_CAPABILITY_AVX2)
      list(APPEND _options -mavx2 -mfma -mf16c)
    elseif(_source MATCHES "_avx512\\.cpp$" AND _x86)
      list(APPEND _definitions CPU_CAPABILITY=AVX512 CPU_CAPABILITY_AVX512)
      list(APPEND _options -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c)
    endif()
    set_source_files_properties(${_source} TARGET_DIRECTORY ${target} PROPERTIES
      COMPILE_OPTIONS "${_options}"
      COMPILE_DEFINITIONS "${_definitions}"
      SKIP_PRECOMPILE_HEADERS ON)
  endforeach()
endfunction()
