#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4),
              "mantissa needs LibTorch 2.4 or newer (the per-device autocast API)");

namespace mantissa::amp {

/// RAII guard that turns on autocast for one device type, the C++ twin of Python's
/// `with torch.autocast(device_type, dtype, enabled, cache_enabled):`.
///
/// Enter and exit follow `torch.amp.autocast_mode.autocast` step for step: the previous
/// enabled flag, fast dtype and cache flag are saved, the new ones set and the nesting count
/// incremented; on exit the weight-cast cache is cleared when the outermost guard leaves, and
/// the saved state is restored (also when an exception passes through). Guards nest, and a
/// CPU guard and a CUDA guard can be active at once.
///
/// As in Python, an unsupported dtype warns and disables the guard, and a CUDA guard without
/// a CUDA device warns and does nothing. Never syncs with the device.
class Autocast {
 public:
  /// Python: `torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=...)`.
  Autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true,
           bool cache_enabled = true)
      : device_type_(device_type) {
    TORCH_CHECK_VALUE(at::autocast::is_autocast_available(device_type),
                      "User specified an unsupported autocast device_type '",
                      c10::DeviceTypeName(device_type, /*lower_case=*/true), "'");
    if (enabled && device_type == c10::DeviceType::CUDA && !torch::cuda::is_available()) {
      TORCH_WARN("User provided device_type of 'cuda', but CUDA is not available. Disabling");
      enabled = false;
    }
    if (enabled && dtype != c10::kBFloat16 && dtype != c10::kHalf &&
        (device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA)) {
      TORCH_WARN("In ", c10::DeviceTypeName(device_type),
                 " autocast, but the target dtype is not supported. Disabling autocast.\n",
                 c10::DeviceTypeName(device_type),
                 " Autocast only supports dtype of torch.bfloat16, torch.float16 currently.");
      enabled = false;
    }
    previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
    previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
    at::autocast::set_autocast_enabled(device_type, enabled);
    at::autocast::set_autocast_dtype(device_type, dtype);
    at::autocast::increment_nesting();
    at::autocast::set_autocast_cache_enabled(cache_enabled);
  }

  ~Autocast() {
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
    at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
    at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
  }

  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  Autocast(Autocast&&) = delete;
  Autocast& operator=(Autocast&&) = delete;

  /// The device type this guard switched.
  c10::DeviceType device_type() const noexcept { return device_type_; }

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::kFloat;
  bool previous_cache_enabled_ = true;
};

}  // namespace mantissa::amp
