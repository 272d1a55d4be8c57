#pragma once

/// mantissa's version. CMakeLists.txt reads it from here, so this is the one place to bump it.
#define MANTISSA_VERSION_MAJOR 0
#define MANTISSA_VERSION_MINOR 1
#define MANTISSA_VERSION_PATCH 0

/// The version as one number, major * 10000 + minor * 100 + patch (like FMT_VERSION).
#define MANTISSA_VERSION \
  (MANTISSA_VERSION_MAJOR * 10000 + MANTISSA_VERSION_MINOR * 100 + MANTISSA_VERSION_PATCH)
