#pragma once
// Writing LibTorch archives (optimizer.pt, master_weights.pt, a process's optimizer shard) to
// disk: streamed from LibTorch's zip writer into the file, so an archive of an optimizer's state
// is never also held as one buffer in host memory, and atomic as every checkpoint file is.

#include <string>

#include <torch/serialize/output-archive.h>

namespace mantissa::io {

/// Writes `archive` (what `OutputArchive::save_to(path)` would write, byte for byte) to `path`
/// through a temporary file in the same folder, renamed over `path` once complete; the bytes go
/// to the file as the zip writer produces them. On a failed write, `path` keeps its old content
/// and a c10::Error names the path and the reason. Python: `torch.save(obj, path)`. Copies
/// device tensors to the host one at a time; no other sync.
void save_torch_archive(const std::string& path, torch::serialize::OutputArchive& archive);

/// The bytes `archive.save_to` writes, in memory: for an archive that travels between processes
/// or is read back at once rather than written to a file. Python: `torch.save(obj, io.BytesIO())`.
std::string archive_bytes(torch::serialize::OutputArchive& archive);

}  // namespace mantissa::io
