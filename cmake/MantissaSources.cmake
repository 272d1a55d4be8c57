# The files that make up the library. Listed by hand so a new file is a reviewed change.
set(MANTISSA_PUBLIC_HEADERS
  include/mantissa/mantissa.h
  include/mantissa/version.h
  include/mantissa/arg.h
  include/mantissa/training_arguments.h
  include/mantissa/amp/autocast.h
  include/mantissa/amp/tf32_guard.h
  include/mantissa/amp/unscale.h
  include/mantissa/amp/supports_amp_scaling.h
  include/mantissa/amp/grad_scaler.h
)
set(MANTISSA_CXX_SOURCES
  src/training_arguments.cpp
  src/amp/tf32_guard.cpp
  src/amp/unscale.cpp
  src/amp/grad_scaler.cpp
  src/io/atomic_file.cpp
)
set(MANTISSA_CUDA_SOURCES
  src/amp/unscale_cuda.cu
)
list(TRANSFORM MANTISSA_PUBLIC_HEADERS PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
list(TRANSFORM MANTISSA_CXX_SOURCES PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
list(TRANSFORM MANTISSA_CUDA_SOURCES PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
