#pragma once
// A walk over the opcodes of a pickle before LibTorch's unpickler runs it, refusing what would
// make the unpickler allocate memory the bytes do not pay for.
//
// LibTorch's Unpickler (torch/csrc/jit/serialization/unpickler.cpp) sizes two things from
// numbers in the stream: the memo table grows to the highest id a BINPUT / LONG_BINPUT names
// (a 4-byte id asks for up to 64 GiB), and a string is allocated at the length its
// BINUNICODE / BINUNICODE8 header claims before its bytes are read. Every pickler numbers its
// memo entries 0, 1, 2, ... and writes each string's bytes after its length, so a pickle that
// does otherwise is hostile or damaged and is refused here with a message naming the byte.

#include <cstddef>
#include <string>

namespace mantissa::io {

/// Throws a c10::Error naming `where` and the byte offset unless the pickle in
/// [data, data + size) up to its STOP opcode is well formed in the ways LibTorch's unpickler
/// trusts: every opcode's argument lies inside the bytes, every length-prefixed string or
/// bytes object fits in what follows its length, and every memo id that BINPUT / LONG_BINPUT
/// stores is at most one past the highest stored so far. Opcodes are not executed; a byte
/// that is no pickle opcode ends the walk (the unpickler refuses it there). Bytes after STOP
/// are not looked at. No Python equivalent (pickletools.genops walks the same opcodes).
void check_pickle_is_bounded(const char* data, std::size_t size, const std::string& where);

}  // namespace mantissa::io
