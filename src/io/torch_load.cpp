#include "io/torch_load.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <unordered_set>
#include <utility>

#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/storage_context.h>

#include "io/atomic_file.h"
#include "io/pickle_scan.h"
#include "io/zip_directory.h"

namespace mantissa::io {
namespace {

// The part of [pos, pos + n) that lies inside [0, size) is copied from `data`; the rest of `buf`
// is zeroed, so a caller that ignores the count still sees defined bytes. Returns the count
// copied: a short count is how miniz learns that an offset in the archive points past its end.
std::size_t copy_in_bounds(const char* data, std::uint64_t size, std::uint64_t pos, void* buf,
                           std::size_t n) {
  auto* out = static_cast<char*>(buf);
  const std::size_t available =
      pos >= size ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(n, size - pos));
  if (available > 0) std::memcpy(out, data + pos, available);
  if (available < n) std::memset(out + available, 0, n - available);
  return available;
}

class BytesReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReader(std::vector<char> bytes) : bytes_(std::move(bytes)) {}
  std::size_t size() const override { return bytes_.size(); }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n, const char*) const override {
    return copy_in_bounds(bytes_.data(), bytes_.size(), pos, buf, n);
  }

 private:
  std::vector<char> bytes_;
};

// A regular file read with pread(2), never past the size it had when opened. Errors are short
// counts, not exceptions: the reads are called from miniz's C code.
class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path) {
    check_regular_file(path);
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    TORCH_CHECK(fd_ >= 0, "cannot open '", path, "': ", std::strerror(errno));
    struct stat info {};
    if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd_);
      TORCH_CHECK(false, "cannot read '", path, "': not a regular file");
    }
    size_ = static_cast<std::uint64_t>(info.st_size);
  }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  ~FileReader() { ::close(fd_); }

  std::uint64_t size() const { return size_; }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n) const {
    auto* out = static_cast<char*>(buf);
    const std::size_t wanted =
        pos >= size_ ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(n, size_ - pos));
    std::size_t done = 0;
    while (done < wanted) {
      const ssize_t got = ::pread(fd_, out + done, wanted - done, static_cast<off_t>(pos + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;  // an error, or the file shrank: a short read
      done += static_cast<std::size_t>(got);
    }
    if (done < n) std::memset(out + done, 0, n - done);
    return done;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// The file as LibTorch's zip reader sees it, for the checks that run before LibTorch's own
// loader opens the file again.
class FileAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit FileAdapter(std::shared_ptr<const FileReader> file) : file_(std::move(file)) {}
  std::size_t size() const override { return static_cast<std::size_t>(file_->size()); }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n, const char*) const override {
    return file_->read(pos, buf, n);
  }

 private:
  std::shared_ptr<const FileReader> file_;
};

// Throws unless `tensor` lies wholly inside its storage: the bytes from its offset to its last
// element, at its strides, fit in storage().nbytes().
void check_tensor(const at::Tensor& tensor, const std::string& where) {
  if (!tensor.defined()) return;
  TORCH_CHECK_VALUE(tensor.layout() == c10::kStrided && !tensor.is_quantized(), where, " is a ",
                    tensor.layout(), tensor.is_quantized() ? " quantized" : "",
                    " tensor; only dense tensors are read");
  TORCH_CHECK_VALUE(tensor.has_storage(), where, " is a tensor without storage");
  const std::int64_t offset = tensor.storage_offset();
  TORCH_CHECK_VALUE(offset >= 0, where, " has the negative storage offset ", offset);
  if (tensor.numel() == 0) return;
  // A storage declared with no elements (or a negative count) is never read from the archive,
  // whatever byte count the pickle gives it.
  TORCH_CHECK_VALUE(tensor.storage().data() != nullptr, where, " (shape ", tensor.sizes(), ", ",
                    tensor.scalar_type(), ") has elements but no bytes behind them");
  std::uint64_t last = static_cast<std::uint64_t>(offset);
  bool overflow = false;
  for (std::int64_t d = 0; d < tensor.dim(); ++d) {
    const std::int64_t stride = tensor.stride(d);
    TORCH_CHECK_VALUE(stride >= 0, where, " has the negative stride ", stride, " in dimension ", d);
    std::uint64_t span = 0;
    overflow |= c10::mul_overflows(static_cast<std::uint64_t>(tensor.size(d) - 1),
                                   static_cast<std::uint64_t>(stride), &span);
    overflow |= c10::add_overflows(last, span, &last);
  }
  std::uint64_t end = 0;
  overflow |= c10::add_overflows(last, std::uint64_t{1}, &end);
  overflow |= c10::mul_overflows(end, static_cast<std::uint64_t>(tensor.element_size()), &end);
  const std::uint64_t available = tensor.storage().nbytes();
  TORCH_CHECK_VALUE(!overflow && end <= available, where, " (shape ", tensor.sizes(), ", strides ",
                    tensor.strides(), ", offset ", offset, ", ", tensor.scalar_type(),
                    ") reaches past the end of its storage of ", available, " bytes");
}

// The storages the unpickler made, each declared with its element count in the pickle, must
// fit in the record of the archive that holds its bytes: LibTorch trusts the count, so a
// storage declared larger than its record would read past the record's buffer.
void check_storages_fit_records(caffe2::serialize::PyTorchStreamReader& reader,
                                torch::jit::DeserializationStorageContext& storages,
                                const std::string& tensor_dir) {
  for (const auto& record : reader.getAllRecords()) {
    if (record.rfind(tensor_dir, 0) != 0) continue;
    const auto key = record.substr(tensor_dir.size());
    if (!storages.hasStorage(key)) continue;
    const auto declared = storages.getStorage(key).nbytes();
    const auto held = reader.getRecordSize(record);
    TORCH_CHECK_VALUE(declared <= held, "the storage '", key, "' is declared with ", declared,
                      " bytes, but its record '", record, "' holds ", held);
  }
}

// Every pickle in the archive must be bounded (io/pickle_scan.h) before LibTorch's unpickler
// reads it: the unpickler sizes its memo table and strings from the pickle's numbers. The
// records themselves were bounded by check_zip_record_sizes before the reader was made.
void check_pickles_are_bounded(caffe2::serialize::PyTorchStreamReader& reader,
                               const std::string& what) {
  const std::string suffix = "pkl";  // data.pkl, constants.pkl, code/*.debug_pkl
  for (const auto& record : reader.getAllRecords()) {
    if (record.size() < suffix.size() ||
        record.compare(record.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const auto [bytes, size] = reader.getRecord(record);
    check_pickle_is_bounded(static_cast<const char*>(bytes.get()), size,
                            what + ": its record '" + record + "'");
  }
}

}  // namespace

void check_tensors_fit_storage(const c10::IValue& value, const std::string& where) {
  // Depth-first without recursion, each container once: a hostile pickle can nest deeply and
  // can make a list that holds itself.
  std::vector<std::pair<c10::IValue, std::string>> pending;
  std::unordered_set<const void*> seen;
  const auto push = [&](const c10::IValue& item, std::string path) {
    if (item.isTensor() || item.isList() || item.isTuple() || item.isGenericDict() ||
        item.isObject()) {
      pending.emplace_back(item, std::move(path));
    }
  };
  // Through push, as any other: an archive's top-level values may be numbers, bools or None
  // (a module scripted in Python has `training` and `_is_full_backward_hook`).
  push(value, where);
  while (!pending.empty()) {
    auto [item, path] = std::move(pending.back());
    pending.pop_back();
    if (item.isTensor()) {
      check_tensor(item.toTensor(), path);
      continue;
    }
    if (!seen.insert(item.internalToPointer()).second) continue;
    if (item.isList()) {
      const auto list = item.toListRef();
      for (std::size_t i = 0; i < list.size(); ++i)
        push(list[i], path + "[" + std::to_string(i) + "]");
    } else if (item.isTuple()) {
      const auto& elements = item.toTupleRef().elements();
      for (std::size_t i = 0; i < elements.size(); ++i) {
        push(elements[i], path + "[" + std::to_string(i) + "]");
      }
    } else if (item.isGenericDict()) {
      for (const auto& entry : item.toGenericDict()) {
        const auto key =
            entry.key().isString() ? "'" + entry.key().toStringRef() + "'" : std::string("(a key)");
        push(entry.key(), path + " key " + key);
        push(entry.value(), path + "[" + key + "]");
      }
    } else if (item.isObject()) {
      const auto object = item.toObject();
      const auto& slots = object->slots();
      for (std::size_t i = 0; i < slots.size(); ++i) {
        push(slots[i], path + "." + object->type()->getAttributeName(i));
      }
    }
  }
}

c10::IValue load_torch_bytes(std::vector<char> bytes) {
  // torch::pickle_load (torch/csrc/jit/serialization/pickle.cpp) over our adapter, with a
  // storage context that lets us see the storages the unpickler made.
  auto adapter = std::make_shared<BytesReader>(std::move(bytes));
  check_zip_record_sizes([&adapter](std::uint64_t pos, void* buf,
                                    std::size_t n) { return adapter->read(pos, buf, n, ""); },
                         adapter->size(), "the file");
  caffe2::serialize::PyTorchStreamReader reader(adapter);
  check_pickles_are_bounded(reader, "the file");
  auto storages = std::make_shared<torch::jit::DeserializationStorageContext>();
  auto value = torch::jit::readArchiveAndTensors(
      "data", /*pickle_prefix=*/"", /*tensor_prefix=*/"", /*type_resolver=*/std::nullopt,
      /*obj_loader=*/std::nullopt, /*device=*/std::nullopt, reader,
      torch::jit::Unpickler::defaultTypeParser, storages);
  check_storages_fit_records(reader, *storages, "data/");
  check_tensors_fit_storage(value, "the value");
  return value;
}

c10::IValue load_torch_file(const std::string& path) { return load_torch_bytes(read_file(path)); }

void load_torch_archive(const std::string& path, torch::serialize::InputArchive& archive,
                        std::optional<c10::Device> device) {
  auto file = std::make_shared<FileReader>(path);
  const std::string what = "'" + path + "'";
  try {
    check_zip_record_sizes(
        [&file](std::uint64_t pos, void* buf, std::size_t n) { return file->read(pos, buf, n); },
        file->size(), what);
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<FileAdapter>(file));
    check_pickles_are_bounded(reader, what);
    archive.load_from(
        [file](std::uint64_t pos, void* buf, std::size_t n) { return file->read(pos, buf, n); },
        [file] { return static_cast<std::size_t>(file->size()); }, device);
  } catch (const c10::ValueError&) {
    throw;
  } catch (const c10::Error& e) {
    // LibTorch's zip reader does not say which file it was reading.
    const std::string message = e.what_without_backtrace();
    if (message.find(what) != std::string::npos) throw;
    TORCH_CHECK(false, what, ": ", message);
  }
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    archive.read(key, value);
    check_tensors_fit_storage(value, "'" + key + "'");
  }
}

}  // namespace mantissa::io
