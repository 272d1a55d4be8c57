# `cmake --install` produces a package that `find_package(mantissa CONFIG)` finds.
include(CMakePackageConfigHelpers)
set(MANTISSA_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/mantissa")

# The installed libmantissa.so looks for its libraries next to itself and nowhere else: an
# installed package must not point into the tree, or the venv, it was built from. LibTorch's
# libraries are found by the program that links mantissa, through its own RUNPATH;
# mantissa-config.cmake makes that program need the few LibTorch libraries that libmantissa.so
# needs and LibTorch's own targets leave out (docs/building.md, "Installing mantissa").
# INSTALL_RPATH_USE_LINK_PATH stays off: it would copy every link directory into the RUNPATH,
# the build's venv and the directories LibTorch's MKL target names (/lib/intel64_win, ...).
set(MANTISSA_INSTALL_RPATH "$ORIGIN" CACHE STRING
  "RUNPATH of the installed libmantissa.so, a ;-list (default \$ORIGIN; docs/building.md, \"Installing mantissa\")")
set_target_properties(mantissa PROPERTIES
  INSTALL_RPATH "${MANTISSA_INSTALL_RPATH}"
  INSTALL_RPATH_USE_LINK_PATH OFF)
# `cmake --install` rewrites the RUNPATH only of a file it copies, and it skips a library whose
# build-tree file has not changed since the last install. Relink when the value changes, so that
# a new MANTISSA_INSTALL_RPATH reaches a prefix installed before.
file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/mantissa-install-rpath.txt"
  CONTENT "${MANTISSA_INSTALL_RPATH}\n")
set_property(TARGET mantissa APPEND PROPERTY LINK_DEPENDS "${PROJECT_BINARY_DIR}/mantissa-install-rpath.txt")

# What mantissa-config.cmake needs to know about this build.
# - Does LibTorch have CUDA, and which libcudart.so.N does it (and our kernels) load?
set(MANTISSA_PACKAGE_TORCH_CUDA OFF)
set(MANTISSA_PACKAGE_CUDART_MAJOR "")
if(TARGET torch_cuda)
  set(MANTISSA_PACKAGE_TORCH_CUDA ON)
  if(MANTISSA_TORCH_CUDA_VERSION MATCHES "^([0-9]+)")    # torch.version.cuda
    set(MANTISSA_PACKAGE_CUDART_MAJOR "${CMAKE_MATCH_1}")
  elseif(CUDAToolkit_VERSION_MAJOR)                        # LibTorch's own CUDA probe
    set(MANTISSA_PACKAGE_CUDART_MAJOR "${CUDAToolkit_VERSION_MAJOR}")
  endif()
endif()
# - Do the CPU kernels use the libgomp.so.1 that ships inside LibTorch (cmake/MantissaCpuKernels.cmake)?
get_target_property(_mantissa_links mantissa LINK_LIBRARIES)
set(MANTISSA_PACKAGE_TORCH_OPENMP OFF)
if("${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1" IN_LIST _mantissa_links)
  set(MANTISSA_PACKAGE_TORCH_OPENMP ON)
endif()
unset(_mantissa_links)

install(TARGETS mantissa EXPORT mantissa-targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/mantissa" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT mantissa-targets NAMESPACE mantissa:: DESTINATION ${MANTISSA_CMAKE_DIR})

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/mantissa-config.cmake.in"
  "${PROJECT_BINARY_DIR}/mantissa-config.cmake" INSTALL_DESTINATION ${MANTISSA_CMAKE_DIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/mantissa-config-version.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/mantissa-config.cmake"
              "${PROJECT_BINARY_DIR}/mantissa-config-version.cmake"
        DESTINATION ${MANTISSA_CMAKE_DIR})
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/mantissa)
