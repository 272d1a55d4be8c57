# One precompiled <torch/torch.h> shared by every test, example and benchmark executable
# (REUSE_FROM): on two cores each extra PCH costs most of a minute.
add_library(mantissa_pch OBJECT "${PROJECT_SOURCE_DIR}/cmake/pch.cpp")
target_link_libraries(mantissa_pch PRIVATE mantissa::mantissa)
target_precompile_headers(mantissa_pch PRIVATE <torch/torch.h>)

# Give an executable the shared PCH. Its compile flags must match mantissa_pch's, so targets
# that add definitions of their own should not call this.
function(mantissa_use_pch target)
  if(MANTISSA_PCH)
    target_precompile_headers(${target} REUSE_FROM mantissa_pch)
  endif()
endfunction()
