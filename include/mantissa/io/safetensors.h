#pragma once
// Reading and writing the safetensors format (https://github.com/huggingface/safetensors), the
// format of Hugging Face's `model.safetensors`.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON (padded with spaces to a
// multiple of 8)
//
//     {"__metadata__": {"format": "pt"},
//      "fc1.weight": {"dtype": "F32", "shape": [16, 8], "data_offsets": [0, 512]}, ...}
//
// then the raw little-endian bytes of the tensors, one after the other, without gaps, in the
// order of their offsets. Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL,
// and also U64, U32, U16, F8_E4M3, F8_E5M2, C64.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <mantissa/io/state_dict.h>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace mantissa::io {

/// Writes `tensors` to `path` in the safetensors format, in the given order. Python:
/// `safetensors.torch.save_file(dict(tensors), path, metadata={"format": "pt", **metadata})`.
///
/// Each tensor is copied to the CPU and made contiguous one at a time while the file is
/// written, so non-contiguous views, GPU tensors and shared storage are all fine (the file
/// holds the values; it never shares). The file is written atomically: a temporary file in the
/// same folder, renamed over `path` only once complete, so a failure leaves any old `path`
/// intact. `metadata` goes into `__metadata__`; `"format": "pt"` is added unless `metadata`
/// sets "format" itself.
///
/// Throws `c10::ValueError` for a duplicate or reserved ("__metadata__") name, an undefined or
/// sparse tensor, or a dtype safetensors cannot hold (naming the tensor); `c10::Error` naming
/// the file when it cannot be written. Syncs with the device of each GPU tensor (the copy).
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of a safetensors file, in file order (by data offset), as CPU tensors.
/// Python: `safetensors.torch.load_file(path)` (which returns a dict).
///
/// The file is checked before any tensor memory is allocated: a header length beyond the
/// file, JSON that does not parse or is not shaped as above, an unknown dtype, offsets that
/// overlap, leave gaps, point past the end of the file or disagree with dtype and shape,
/// trailing bytes, a truncated file. Each raises a `c10::Error` naming the file and what is
/// wrong; a bad file never crashes the reader. No device work.
std::vector<std::pair<std::string, at::Tensor>> load_safetensors(const std::string& path);

/// The `__metadata__` of a safetensors file (empty when it has none), after the same header
/// checks as `load_safetensors`. Python: `safe_open(path, "pt").metadata()`.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

/// An open safetensors file whose tensors are read one at a time, or in part, without reading
/// the rest: what a reader of one rank's piece of a large file needs. Python:
/// `safetensors.safe_open(path, framework="pt")` with `get_tensor` and `get_slice`.
///
/// Opening reads and checks the header as `load_safetensors` does (so a bad file raises a
/// `c10::Error` naming it before any tensor is read); the file stays open until the object is
/// destroyed. Reads are `pread`s, safe from several threads. No device work.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  /// The file's path, as given.
  const std::string& path() const;
  /// The tensor names, in file order (by data offset).
  std::vector<std::string> keys() const;
  /// Whether the file holds a tensor `name`.
  bool contains(const std::string& name) const;
  /// The `__metadata__` (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const;
  /// Tensor `name`'s dtype and shape; a `c10::Error` naming the file when it has no such tensor.
  c10::ScalarType dtype(const std::string& name) const;
  std::vector<std::int64_t> shape(const std::string& name) const;
  /// Tensor `name`, whole, as a CPU tensor. Python: `f.get_tensor(name)`.
  at::Tensor get_tensor(const std::string& name) const;
  /// Elements [begin, begin + numel) of tensor `name` taken in row-major order, as a 1-D CPU
  /// tensor; only those bytes are read. Python: `f.get_slice(name)` on the flattened tensor.
  /// A range outside the tensor raises a `c10::Error` naming the tensor and the file.
  at::Tensor get_flat_slice(const std::string& name, std::int64_t begin, std::int64_t numel) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Writes a module's parameters and buffers (recursively, with Hugging Face's dotted names
/// such as "fc1.weight" and "bn.running_mean") to `path` with `save_safetensors`, parameters
/// first, each in registration order, and metadata `{"format": "pt"}`. Python:
/// `safetensors.torch.save_file(model.state_dict(), path, metadata={"format": "pt"})`, as
/// `Trainer` writes `model.safetensors`. Pass a module holder as `*model`. Syncs like
/// `save_safetensors`.
void save_module_safetensors(const std::string& path, const torch::nn::Module& module);

/// Copies the tensors of a safetensors file into `module`'s existing parameters and buffers
/// with `load_module_state_dict`, whose errors name the file. Python:
/// `model.load_state_dict(safetensors.torch.load_file(path), strict=strict)`.
///
/// The file is read and checked whole before anything is copied, so a failed load leaves the
/// module as it was. Returns the keys that did not match. Syncs with the device of GPU
/// parameters (host-to-device copies).
IncompatibleKeys load_module_safetensors(const std::string& path, torch::nn::Module& module,
                                         bool strict = true, bool allow_dtype_cast = false);

}  // namespace mantissa::io
