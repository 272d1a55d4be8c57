# Compiles each public header alone in its own translation unit, without a precompiled
# header, so a header that forgets one of its own includes fails the build.
function(mantissa_add_header_check target)
  set(_sources)
  foreach(_header IN LISTS ARGN)
    file(RELATIVE_PATH _rel "${PROJECT_SOURCE_DIR}/include" "${_header}")
    string(MAKE_C_IDENTIFIER "${_rel}" _id)
    set(_tu "${CMAKE_CURRENT_BINARY_DIR}/header_check/${_id}.cpp")
    file(CONFIGURE OUTPUT "${_tu}" CONTENT "#include <${_rel}>\n#include <${_rel}>  // and include guards work\n")
    list(APPEND _sources "${_tu}")
  endforeach()
  add_library(${target} OBJECT ${_sources})
  target_link_libraries(${target} PRIVATE mantissa::mantissa)
endfunction()
