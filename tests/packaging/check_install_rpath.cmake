# The packaging.install_rpath test: the RUNPATH of the installed libmantissa.so holds exactly the
# entries MANTISSA_INSTALL_RPATH asks for, and no entry points into the build tree, the source
# tree or the LibTorch install (a venv) that the library was built against.
#
#   cmake -DLIBRARY=<installed libmantissa.so> -DEXPECTED=<entries, ':'-separated>
#         -DFORBIDDEN=<directories, ':'-separated> -P check_install_rpath.cmake
#
# An entry that MANTISSA_INSTALL_RPATH names explicitly is accepted even inside FORBIDDEN: that
# is the documented way to opt in to a RUNPATH into LibTorch's install.
cmake_minimum_required(VERSION 3.25)

if(NOT EXISTS "${LIBRARY}")
  message(FATAL_ERROR "${LIBRARY} does not exist (did packaging.install run?)")
endif()
file(READ_ELF "${LIBRARY}" RPATH _rpath RUNPATH _runpath CAPTURE_ERROR _error)
if(_error)
  message(FATAL_ERROR "cannot read ${LIBRARY}: ${_error}")
endif()

string(REPLACE ":" ";" _entries "${_runpath}")  # CMake may already give it as a ;-list
list(JOIN _entries ":" _runpath)
string(REPLACE ":" ";" _expected "${EXPECTED}")
string(REPLACE ":" ";" _forbidden "${FORBIDDEN}")

set(_problems "")
if(_rpath)
  # DT_RPATH, unlike DT_RUNPATH, would also serve every library loaded on our behalf.
  list(APPEND _problems "  it has a DT_RPATH (${_rpath}); the installed library carries a DT_RUNPATH only")
endif()
foreach(_entry IN LISTS _entries)
  if(_entry IN_LIST _expected)
    continue()
  endif()
  set(_why "not asked for by MANTISSA_INSTALL_RPATH (${EXPECTED})")
  if(_entry STREQUAL "")
    set(_why "an empty entry, which the loader reads as the current directory")
  elseif(_entry MATCHES "(^|[/_-])[Ww][Ii][Nn]([/_-]|$)")
    set(_why "a Windows directory (from LibTorch's MKL link directories)")
  elseif(IS_ABSOLUTE "${_entry}")
    file(REAL_PATH "${_entry}" _entry_real)
    foreach(_dir IN LISTS _forbidden)
      file(REAL_PATH "${_dir}" _dir_real)
      foreach(_a IN ITEMS "${_entry}" "${_entry_real}")
        foreach(_b IN ITEMS "${_dir}" "${_dir_real}")
          string(FIND "${_a}/" "${_b}/" _at)
          if(_at EQUAL 0)
            set(_why "inside ${_dir}, which the installed package must not point into")
          endif()
        endforeach()
      endforeach()
    endforeach()
  endif()
  list(APPEND _problems "  '${_entry}': ${_why}")
endforeach()
if(NOT _problems AND NOT _entries STREQUAL _expected)
  list(APPEND _problems "  it is '${_runpath}', but MANTISSA_INSTALL_RPATH asks for '${EXPECTED}'")
endif()

if(_problems)
  list(JOIN _problems "\n" _problems)
  message(FATAL_ERROR "RUNPATH of ${LIBRARY} is '${_runpath}':\n${_problems}")
endif()
message(STATUS "RUNPATH of ${LIBRARY}: '${_runpath}', as MANTISSA_INSTALL_RPATH asks")
