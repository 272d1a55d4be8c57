#pragma once
// A look at a zip archive's central directory before LibTorch's reader opens it.
//
// PyTorchStreamReader (caffe2/serialize/inline_container.h) allocates each record it reads at
// the uncompressed size the directory claims, and reads the "version" record while it is being
// constructed, so a directory that claims gigabytes for a deflated record exhausts memory
// before any check of ours could run on the reader. A stored record (zip method 0, what
// torch.save writes) cannot be larger than the file, and a deflated one (LibTorch's archives
// deflate their TorchScript code) cannot inflate to more than 1032 times its compressed size;
// this check refuses a record that claims more.
//
// Written by hand over the directory layout of APPNOTE.TXT (sections 4.3.12, 4.3.14-16, with
// the zip64 fields) because LibTorch bundles miniz without its header, and a second zip
// library would disagree with LibTorch's about details we do not need.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace mantissa::io {

/// Reads up to `n` bytes at `pos` into `buf` and returns the count read (short at the end).
using ReadAt = std::function<std::size_t(std::uint64_t pos, void* buf, std::size_t n)>;

/// Throws a c10::Error naming `what` and the record if a record in the zip archive of `size`
/// bytes read through `read` claims more bytes than it can hold: compressed bytes past the
/// archive's end, a stored record more than the archive has, a deflated one more than deflate
/// makes of its compressed bytes, any other method at all. An archive whose directory cannot
/// be found or read is left to LibTorch's reader to refuse.
/// Reads the directory only (a few hundred bytes per record). No Python equivalent (zipfile
/// reads the same fields).
void check_zip_record_sizes(const ReadAt& read, std::uint64_t size, const std::string& what);

}  // namespace mantissa::io
