# Installs the Python package (python/) into PYTHON's environment without a network: a staging
# copy of the sources with libmantissa_ops.so and the libmantissa it links in mantissa/lib (the
# ops library finds it there through its $ORIGIN rpath), then a non-editable pip install of it.
# Run by the CTest test python.install_package (tests/CMakeLists.txt):
#   cmake -DPYTHON=... -DSOURCE_DIR=... -DSTAGING_DIR=... -DOPS_LIBRARY=... -DMANTISSA_LIBRARY=...
#         -P install_package.cmake
foreach(_var PYTHON SOURCE_DIR STAGING_DIR OPS_LIBRARY MANTISSA_LIBRARY)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "install_package.cmake: -D${_var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${STAGING_DIR}")
file(COPY "${SOURCE_DIR}/" DESTINATION "${STAGING_DIR}"
  PATTERN "__pycache__" EXCLUDE PATTERN "*.egg-info" EXCLUDE PATTERN "build" EXCLUDE
  PATTERN "lib" EXCLUDE)
# COPY_FILE reads through links: the one file under the name the ops library asks for (its soname).
file(MAKE_DIRECTORY "${STAGING_DIR}/mantissa/lib")
foreach(_library "${OPS_LIBRARY}" "${MANTISSA_LIBRARY}")
  get_filename_component(_name "${_library}" NAME)
  file(COPY_FILE "${_library}" "${STAGING_DIR}/mantissa/lib/${_name}")
endforeach()
execute_process(
  COMMAND "${PYTHON}" -m pip install --no-deps --no-build-isolation --no-index
          --disable-pip-version-check --force-reinstall --quiet "${STAGING_DIR}"
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pip install of ${STAGING_DIR} failed (${_rc})")
endif()
# Imported from outside the checkout, so that the installed copy is what loads.
execute_process(
  COMMAND "${PYTHON}" -c "import mantissa, torch; print('mantissa', mantissa.__version__, 'from', mantissa.library_path); torch.ops.mantissa.fused_adamw_"
  WORKING_DIRECTORY "${STAGING_DIR}/.."
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "the installed package does not import (${_rc})")
endif()
