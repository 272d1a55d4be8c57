#pragma once
// Writing plain Python containers in torch.save's format, readable by
// torch.load(weights_only=True).

#include <ATen/core/ivalue.h>

#include <vector>

namespace mantissa::io {

/// The bytes `torch.save(value, f)` would write for `value` made of dicts, lists, tuples,
/// strings, numbers, bools and tensors: `torch::pickle_save` without TorchScript's type tags
/// and with typed lists (List[float], ...) written as plain lists.
///
/// `torch::pickle_save` wraps every typed dict and list in `torch.jit._pickle.restore_type_tag`
/// and builds List[float] with `torch.jit._pickle.build_doublelist`; Python's `torch.load`
/// refuses both under `weights_only=True`, the default since PyTorch 2.6 and what Hugging
/// Face's Trainer passes explicitly when it loads `scheduler.pt`.
/// Without the tags the file holds only plain containers; `torch::pickle_load` reads it back
/// (dicts come back as `Dict[Any, Any]`, lists as `List[Any]`).
std::vector<char> torch_save_bytes(const c10::IValue& value);

}  // namespace mantissa::io
