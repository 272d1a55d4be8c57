#pragma once

#include <cstdint>

namespace mantissa::amp {

/// RAII guard that allows (or forbids) TensorFloat-32 in cuBLAS matmuls and cuDNN
/// convolutions, restoring the previous setting on exit (also when an exception passes).
///
/// Python: `torch.backends.cuda.matmul.allow_tf32 = allow; torch.backends.cudnn.allow_tf32 =
/// allow` (HF's `--tf32`), undone afterwards. On LibTorch 2.9 and newer it uses the
/// `setFloat32Precision` API only, below it the `allowTF32CuBLAS`/`allowTF32CuDNN` flags only:
/// mixing the two raises in new releases. Process-wide, like the flags it sets; never syncs.
class Tf32Guard {
 public:
  /// `allow = true`: matmul and conv may use TF32. `false`: full IEEE fp32.
  explicit Tf32Guard(bool allow);
  ~Tf32Guard();

  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;
  Tf32Guard(Tf32Guard&&) = delete;
  Tf32Guard& operator=(Tf32Guard&&) = delete;

 private:
  // Opaque saved settings: precision codes (2.9+) or the two flags (older).
  std::int32_t saved_matmul_;
  std::int32_t saved_conv_;
};

/// True when TF32 is currently allowed for CUDA matmuls (read through the same API as
/// `Tf32Guard` uses). Python: `torch.backends.cuda.matmul.allow_tf32`.
bool tf32_matmul_allowed();

/// True when TF32 is currently allowed for cuDNN convolutions.
/// Python: `torch.backends.cudnn.allow_tf32`.
bool tf32_conv_allowed();

}  // namespace mantissa::amp
