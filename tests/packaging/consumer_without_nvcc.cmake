# The packaging.find_package_no_nvcc test: configures, builds and runs the find_package consumer
# as on a machine without a CUDA compiler. No -DCMAKE_CUDA_COMPILER, no directory with an nvcc
# on PATH, no CUDA_HOME or CUDA_PATH, and CUDACXX naming a file that does not exist, so that
# anything that enables the CUDA language stops the configuration. The program then runs with
# the loader's cache turned off, so that no CUDA toolkit listed in ld.so.conf can supply a library
# the program's own RUNPATH fails to find.
#
#   cmake -DSOURCE_DIR=<consumer project> -DBINARY_DIR=<its build dir> -DPREFIX=<mantissa install>
#         -DTORCH_DIR=<.../share/cmake/Torch> -DGENERATOR=<generator> [-DBUILD_TYPE=Release]
#         [-DLAUNCHER=<compiler launcher, '|'-separated>] -DPASS_REGEX=<expected output>
#         -P consumer_without_nvcc.cmake
cmake_minimum_required(VERSION 3.25)

foreach(_var SOURCE_DIR BINARY_DIR PREFIX TORCH_DIR GENERATOR PASS_REGEX)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "consumer_without_nvcc.cmake needs -D${_var}=...")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

# --- A machine without nvcc ---
set(_path "")
string(REPLACE ":" ";" _dirs "$ENV{PATH}")
foreach(_dir IN LISTS _dirs)
  if(NOT EXISTS "${_dir}/nvcc")
    list(APPEND _path "${_dir}")
  endif()
endforeach()
list(JOIN _path ":" _path)
set(ENV{PATH} "${_path}")
foreach(_var CUDA_HOME CUDA_PATH CUDA_ROOT CUDA_BIN_PATH CUDAToolkit_ROOT CUDA_TOOLKIT_ROOT_DIR)
  unset(ENV{${_var}})
endforeach()
set(ENV{CUDACXX} "${BINARY_DIR}/there-is-no-cuda-compiler/nvcc")

macro(check_step what)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${_rc}):\n${step_output}")
  endif()
endmacro()
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE step_output ERROR_VARIABLE step_output)
  check_step("${what}")
  set(step_output "${step_output}" PARENT_SCOPE)
endfunction()

# --- Configure from scratch, so that no cached compiler survives ---
file(REMOVE "${BINARY_DIR}/CMakeCache.txt")
string(REPLACE "|" ";" _launcher "${LAUNCHER}")
# The launcher is a list: it goes in one quoted argument, so it cannot pass through run_step.
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DTorch_DIR=${TORCH_DIR} -DCMAKE_PREFIX_PATH=${PREFIX}
    "-DCMAKE_CXX_COMPILER_LAUNCHER=${_launcher}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE step_output ERROR_VARIABLE step_output)
check_step("configuring ${SOURCE_DIR} without a CUDA compiler")
if(NOT step_output MATCHES "mantissa: no CUDA compiler, LibTorch's CUDA setup skipped")
  message(FATAL_ERROR "mantissa-config.cmake did not take its no-CUDA-compiler path:\n${step_output}")
endif()
file(STRINGS "${BINARY_DIR}/CMakeCache.txt" _cuda_compiler REGEX "^CMAKE_CUDA_COMPILER:")
if(_cuda_compiler)
  message(FATAL_ERROR "the consumer's configuration enabled CUDA: ${_cuda_compiler}")
endif()

run_step("building the consumer" ${CMAKE_COMMAND} --build ${BINARY_DIR})
set(_program "${BINARY_DIR}/consumer")

# --- Where the loader finds each library, with ld.so.cache ignored ---
# glibc's loader for the program's ELF class: the one that accepts it with --verify (as ldd does).
file(GLOB _loaders /lib64/ld-linux*.so.* /lib/ld-linux*.so.* /lib/*-linux-gnu*/ld-linux*.so.*)
set(_loader "")
foreach(_candidate IN LISTS _loaders)
  execute_process(COMMAND ${_candidate} --verify ${_program} RESULT_VARIABLE _rc
                  OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(_loader "${_candidate}")
    break()
  endif()
endforeach()
get_filename_component(_site "${TORCH_DIR}/../../../.." ABSOLUTE)   # site-packages of a wheel
file(REAL_PATH "${_site}" _site)
file(REAL_PATH "${PREFIX}" _prefix)
if(_loader)
  run_step("listing the consumer's libraries" ${_loader} --inhibit-cache --list ${_program})
  set(_libraries "${step_output}")
  if(_libraries MATCHES "([^\n\t ]+) => not found")
    message(FATAL_ERROR "the loader finds no ${CMAKE_MATCH_1} for the consumer:\n${_libraries}")
  endif()
  if(NOT _libraries MATCHES "[\t ]libmantissa\\.so")
    message(FATAL_ERROR "the consumer does not load libmantissa.so:\n${_libraries}")
  endif()
  # libmantissa.so from the install; the libraries it takes from LibTorch from LibTorch's install.
  foreach(_pair "libmantissa\\.so[.0-9]*|${_prefix}" "libc10_cuda\\.so|${_site}"
                "libcudart\\.so[.0-9]*|${_site}" "libgomp\\.so\\.1|${_site}")
    string(REPLACE "|" ";" _pair "${_pair}")
    list(GET _pair 0 _name)
    list(GET _pair 1 _where)
    if(_libraries MATCHES "[\t ]${_name} => ([^\n ]+)")
      file(REAL_PATH "${CMAKE_MATCH_1}" _found)
      string(FIND "${_found}" "${_where}/" _at)
      if(NOT _at EQUAL 0)
        message(FATAL_ERROR "${_name} comes from ${_found}, not from ${_where}:\n${_libraries}")
      endif()
    endif()
  endforeach()
  set(_run ${_loader} --inhibit-cache ${_program})
else()
  message(STATUS "no glibc loader accepts ${_program}; running it with the loader's cache")
  set(_run ${_program})
endif()

# --- Run it ---
run_step("running the consumer" ${_run})
if(NOT step_output MATCHES "${PASS_REGEX}")
  message(FATAL_ERROR "the consumer's output does not match '${PASS_REGEX}':\n${step_output}")
endif()
message(STATUS "${step_output}")
