#pragma once
// Reading torch.save-format files (zip archives holding a pickle and tensor records) whatever
// their bytes: the one way mantissa reads scaler.pt, scheduler.pt, rng_state*.pth,
// optimizer.pt and master_weights.pt.
//
// LibTorch's own entry points are not safe on hostile bytes. `torch::pickle_load` hands the zip
// reader an adapter that copies past the end of its buffer when an offset in the archive points
// there (a file cut inside its end-of-central-directory record), and the unpickler builds a
// tensor of whatever shape the pickle names over a storage of whatever size the archive holds,
// so reading the tensor reads past its storage; it also allocates what the zip directory and
// the pickle claim (a record's size, the memo table, a string) before reading a byte of it.
// Here every read of the bytes is bounds-checked, every record and pickle is checked against
// the bytes there are before LibTorch reads them (io/pickle_scan.h), and every tensor that
// comes out is checked against its storage before anyone sees it.

#include <ATen/core/ivalue.h>
#include <torch/serialize/input-archive.h>

#include <optional>
#include <string>
#include <vector>

namespace mantissa::io {

/// The value in the bytes of a `torch.save` file of plain containers and tensors (what
/// `torch_save_bytes` writes): Python's `torch.load(f, weights_only=True)`, LibTorch's
/// `torch::pickle_load`, but bounds-checked. Raises a c10::Error on a damaged or hostile
/// archive, and a c10::ValueError when a tensor in it does not fit its storage. Tensors come
/// back on the CPU; no device sync.
c10::IValue load_torch_bytes(std::vector<char> bytes);

/// `load_torch_bytes` of the whole regular file at `path` (at most `kMaxReadFileBytes`).
c10::IValue load_torch_file(const std::string& path);

/// Loads the LibTorch archive at `path` (what `torch::serialize::OutputArchive::save_to`
/// writes: optimizer.pt, master_weights.pt) into `archive`, reading the file through a
/// bounds-checked adapter, then checks every tensor in it against its storage as
/// `load_torch_bytes` does. No size limit (an optimizer's state can be large). Python has no
/// equivalent (these are TorchScript modules: `torch.jit.load`). No device sync.
/// With `device`, every tensor is read onto it instead of the device it was saved from.
void load_torch_archive(const std::string& path, torch::serialize::InputArchive& archive,
                        std::optional<c10::Device> device = std::nullopt);

/// Throws a c10::ValueError naming `where` unless every tensor reachable from `value` (through
/// lists, tuples, dicts and object attributes) is strided, has a non-negative offset and
/// strides, and lies wholly inside its storage. Values that contain themselves are walked once.
void check_tensors_fit_storage(const c10::IValue& value, const std::string& where);

}  // namespace mantissa::io
