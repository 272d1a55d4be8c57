#pragma once
// Small helpers shared by the test files.

#include <gtest/gtest.h>
#include <torch/cuda.h>

/// Skips a CUDA test with the reason when this machine has no GPU.
#define MANTISSA_SKIP_WITHOUT_CUDA()                                           \
  do {                                                                         \
    if (!torch::cuda::is_available()) {                                        \
      GTEST_SKIP() << "no CUDA device on this machine; runs on the GPU check"; \
    }                                                                          \
  } while (0)
