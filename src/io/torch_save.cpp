#include "io/torch_save.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace mantissa::io {
namespace {

// `value` with every list as List[Any]: the pickler writes List[float], List[int], List[bool]
// and List[Tensor] through torch.jit._pickle.build_doublelist & co., which
// torch.load(weights_only=True) refuses, even with tag_aggregates off.
c10::IValue plain(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const auto& item : value.toListRef()) list.push_back(plain(item));
    return list;
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), c10::AnyType::get());
    for (const auto& entry : dict) out.insert(entry.key(), plain(entry.value()));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& item : value.toTupleRef().elements()) items.push_back(plain(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

}  // namespace

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  // torch::pickle_save (torch/csrc/jit/serialization/pickle.cpp) with tag_aggregates = false.
  std::vector<char> pickle_data;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) {
        pickle_data.insert(pickle_data.end(), bytes, bytes + size);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(plain(value));
  pickler.stop();

  std::vector<char> container;
  container.reserve(pickle_data.size() + 1024);
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    container.insert(container.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle_data.data(), pickle_data.size(),
                                     pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return container;
}

}  // namespace mantissa::io
