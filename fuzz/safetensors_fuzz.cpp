// Fuzz target: a whole safetensors file (header and body) read by load_safetensors, by
// load_safetensors_metadata, into a small module by load_module_safetensors, and tensor by
// tensor and range by range through SafetensorsFile (the reader of sharded loads).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <mantissa/io/safetensors.h>
#include "io/filesystem.h"

#include "fuzz_util.h"

namespace {

// Names a seed file can match ("fc.weight", "fc.bias", "scale"), so that the module load
// reaches its shape and dtype checks and its copies.
struct Small : torch::nn::Module {
  Small() {
    fc = register_module("fc", torch::nn::Linear(3, 2));
    scale = register_buffer("scale", torch::ones({2}));
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor scale;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path =
      mantissa::io::join_path(mantissa_fuzz::scratch_dir(), "input.safetensors");
  static Small module;
  mantissa_fuzz::write_bytes(path, std::string_view(reinterpret_cast<const char*>(data), size));
  mantissa_fuzz::expect_no_crash([&] {
    for (const auto& [name, tensor] : mantissa::io::load_safetensors(path)) {
      // Touch every byte: a tensor whose storage is smaller than its shape says shows up here.
      if (tensor.numel() > 0) (void)tensor.flatten().view(at::kByte).sum().item<std::int64_t>();
    }
  });
  mantissa_fuzz::expect_no_crash([&] { mantissa::io::load_safetensors_metadata(path); });
  mantissa_fuzz::expect_no_crash([&] {
    const mantissa::io::SafetensorsFile file(path);
    for (const auto& name : file.keys()) {
      const auto whole = file.get_tensor(name);
      if (whole.numel() > 0) (void)whole.flatten().view(at::kByte).sum().item<std::int64_t>();
      // A range from the middle, through the reader's own offsets.
      const auto n = whole.numel();
      const auto piece = file.get_flat_slice(name, n / 3, n - n / 3 - n / 4);
      if (piece.numel() > 0) (void)piece.view(at::kByte).sum().item<std::int64_t>();
    }
  });
  mantissa_fuzz::expect_no_crash(
      [&] { mantissa::io::load_module_safetensors(path, module, /*strict=*/false, true); });
  return 0;
}
