# `cmake --install` produces a package that `find_package(mantissa CONFIG)` finds.
include(CMakePackageConfigHelpers)
set(MANTISSA_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/mantissa")

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
