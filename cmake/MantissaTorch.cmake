# Finds LibTorch and decides whether the CUDA kernels are built.
#
# LibTorch is taken, in this order, from a user-given Torch_DIR or CMAKE_PREFIX_PATH, or from the
# Python interpreter MANTISSA_PYTHON (default: the project venv .venv/bin/python, else python3),
# through torch.utils.cmake_prefix_path. The torch wheel from PyPI is a CUDA build, so its
# TorchConfig enables the CUDA language itself and needs nvcc; we point it at /usr/local/cuda
# when nvcc is not on PATH.
include_guard(GLOBAL)  # included with a policy scope: CMP0104 below stays local

if(NOT MANTISSA_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MANTISSA_CUDA must be AUTO, ON or OFF, not '${MANTISSA_CUDA}'")
endif()

# LibTorch's CUDA setup runs inside find_package(Torch), so these come first.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(MANTISSA_NVCC nvcc HINTS "$ENV{CUDA_HOME}/bin" /usr/local/cuda/bin)
  if(MANTISSA_NVCC)
    set(CMAKE_CUDA_COMPILER "${MANTISSA_NVCC}" CACHE FILEPATH "nvcc")
  endif()
endif()
# LibTorch ignores CMAKE_CUDA_ARCHITECTURES; it reads TORCH_CUDA_ARCH_LIST instead, and its own
# default list includes architectures that nvcc 13 no longer supports. Ampere and Hopper as
# SASS, plus PTX for anything newer.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0+PTX" CACHE STRING "CUDA architectures for LibTorch and mantissa")
endif()
# Let CMake leave CMAKE_CUDA_ARCHITECTURES unset while LibTorch enables CUDA (LibTorch would
# ignore it, and warn); it is set to OFF below, so that nvcc gets only LibTorch's -gencode flags.
cmake_policy(SET CMP0104 OLD)

# A user-given Torch_DIR or CMAKE_PREFIX_PATH comes first; the Python prefix is appended.
if(NOT Torch_DIR OR Torch_DIR MATCHES "NOTFOUND")
  if(NOT MANTISSA_PYTHON)
    if(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/.venv/bin/python")
      set(MANTISSA_PYTHON "${CMAKE_CURRENT_SOURCE_DIR}/.venv/bin/python")
    else()
      find_program(MANTISSA_PYTHON NAMES python3 python)
    endif()
  endif()
  if(MANTISSA_PYTHON)
    execute_process(
      COMMAND "${MANTISSA_PYTHON}" -c
        "import torch; print(torch.utils.cmake_prefix_path + ';' + (torch.version.cuda or ''), end='')"
      OUTPUT_VARIABLE _torch_query ERROR_VARIABLE _torch_error RESULT_VARIABLE _torch_rc)
    if(_torch_rc EQUAL 0)
      list(GET _torch_query 0 _torch_prefix)
      list(GET _torch_query 1 _torch_cuda)
      list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
      set(MANTISSA_TORCH_CUDA_VERSION "${_torch_cuda}" CACHE INTERNAL "torch.version.cuda")
    else()
      message(STATUS "mantissa: '${MANTISSA_PYTHON}' cannot import torch")
    endif()
  endif()
endif()
find_package(Torch CONFIG)
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "mantissa: LibTorch not found. Run scripts/bootstrap (it installs torch==2.11.0 into .venv/), "
    "or pass -DTorch_DIR=<libtorch>/share/cmake/Torch or -DMANTISSA_PYTHON=<python with torch>.")
endif()
message(STATUS "mantissa: LibTorch ${Torch_VERSION} from ${Torch_DIR}")

# Imported targets are visible only in the directory that found them. When a user pulls
# mantissa in with add_subdirectory, mantissa::mantissa's interface names torch, torch_cpu,
# ...; make them global so the user's targets can link without a find_package(Torch) of their own.
if(NOT CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_SOURCE_DIR)
  get_property(_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_target IN LISTS _imported)
    get_target_property(_global ${_target} IMPORTED_GLOBAL)
    if(NOT _global)
      set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()

# Does this LibTorch carry CUDA (torch_cuda), and can we compile .cu files?
set(_torch_has_cuda OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(_torch_has_cuda ON)
endif()
set(_have_nvcc OFF)
if(CMAKE_CUDA_COMPILER)
  set(_have_nvcc ON)
endif()

# Kernels built by one CUDA major version next to a LibTorch built with another would load two
# CUDA runtimes. The C++ part still compiles either way; only our .cu files are held back.
set(_cuda_majors_agree ON)
if(_have_nvcc AND MANTISSA_TORCH_CUDA_VERSION)
  string(REGEX MATCH "^[0-9]+" _torch_major "${MANTISSA_TORCH_CUDA_VERSION}")
  string(REGEX MATCH "^[0-9]+" _nvcc_major "${CMAKE_CUDA_COMPILER_VERSION}")
  if(_nvcc_major AND NOT _torch_major STREQUAL _nvcc_major)
    set(_cuda_majors_agree OFF)
    set(_cuda_advice
      "LibTorch was built with CUDA ${MANTISSA_TORCH_CUDA_VERSION} but nvcc is ${CMAKE_CUDA_COMPILER_VERSION}. "
      "Install a matching toolkit (e.g. the CUDA ${_torch_major} toolkit from your distribution) and pass "
      "-DCMAKE_CUDA_COMPILER=<its nvcc>, or install the torch wheel built for CUDA ${_nvcc_major}; "
      "see docs/building.md.")
  endif()
endif()

set(MANTISSA_WITH_CUDA OFF)
if(MANTISSA_CUDA STREQUAL "ON" AND NOT _cuda_majors_agree)
  message(FATAL_ERROR "MANTISSA_CUDA=ON: ${_cuda_advice}")
elseif(MANTISSA_CUDA STREQUAL "AUTO" AND NOT _cuda_majors_agree)
  message(WARNING "mantissa: building without its CUDA kernels. ${_cuda_advice}")
elseif(MANTISSA_CUDA STREQUAL "ON")
  if(NOT _torch_has_cuda OR NOT _have_nvcc)
    message(FATAL_ERROR "MANTISSA_CUDA=ON but LibTorch has CUDA: ${_torch_has_cuda}, nvcc found: ${_have_nvcc}")
  endif()
  set(MANTISSA_WITH_CUDA ON)
elseif(MANTISSA_CUDA STREQUAL "AUTO" AND _torch_has_cuda AND _have_nvcc)
  set(MANTISSA_WITH_CUDA ON)
endif()
if(MANTISSA_WITH_CUDA)
  enable_language(CUDA)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "mantissa: CUDA kernels ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, torch.version.cuda ${MANTISSA_TORCH_CUDA_VERSION})")
else()
  message(STATUS "mantissa: CUDA kernels OFF (MANTISSA_CUDA=${MANTISSA_CUDA}, LibTorch CUDA: ${_torch_has_cuda}, nvcc: ${_have_nvcc})")
endif()
