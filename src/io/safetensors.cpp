// The safetensors file format: save_safetensors, load_safetensors and their checks of a header
// and its offsets (the module-level calls are in module_safetensors.cpp).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <mantissa/io/safetensors.h>
#include <sys/stat.h>
#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "io/atomic_file.h"
#include "io/json_reader.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mantissa's safetensors reader and writer assume a little-endian host"
#endif

namespace mantissa::io {
// Named rather than anonymous: SafetensorsFile::Impl, a class of the public header, holds these.
namespace safetensors_internal {

// The same limit as the reference implementation (safetensors' MAX_HEADER_SIZE): a header
// length beyond it is taken for a corrupt file rather than allocated.
constexpr std::uint64_t kMaxHeaderSize = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeName {
  const char* name;
  c10::ScalarType type;
};

// safetensors' dtype codes and their torch types: those Python's safetensors 0.8 loads into
// torch (its load_file), except F4, which torch packs two to a byte with a halved shape.
constexpr DtypeName kDtypes[] = {
    {"F64", c10::ScalarType::Double},
    {"F32", c10::ScalarType::Float},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"I64", c10::ScalarType::Long},
    {"I32", c10::ScalarType::Int},
    {"I16", c10::ScalarType::Short},
    {"I8", c10::ScalarType::Char},
    {"U8", c10::ScalarType::Byte},
    {"BOOL", c10::ScalarType::Bool},
    {"U64", c10::ScalarType::UInt64},
    {"U32", c10::ScalarType::UInt32},
    {"U16", c10::ScalarType::UInt16},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
    {"F8_E5M2", c10::ScalarType::Float8_e5m2},
    {"F8_E4M3FNUZ", c10::ScalarType::Float8_e4m3fnuz},
    {"F8_E5M2FNUZ", c10::ScalarType::Float8_e5m2fnuz},
    {"F8_E8M0", c10::ScalarType::Float8_e8m0fnu},
    {"C64", c10::ScalarType::ComplexFloat},
};

std::optional<c10::ScalarType> dtype_from_name(const std::string& name) {
  for (const auto& entry : kDtypes) {
    if (name == entry.name) return entry.type;
  }
  return std::nullopt;
}

const char* name_of_dtype(c10::ScalarType type) {
  for (const auto& entry : kDtypes) {
    if (entry.type == type) return entry.name;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string out;
  for (const auto& entry : kDtypes) {
    if (!out.empty()) out += ", ";
    out += entry.name;
  }
  return out;
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

std::string errno_text() { return std::strerror(errno); }

// ---------------------------------------------------------------------------------------------
// Reading

struct Entry {
  std::string name;
  c10::ScalarType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin;
  std::uint64_t end;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start;  // 8 + header length
};

class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::string& path) : path_(path) {
    do {
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
    } while (fd_ < 0 && errno == EINTR);
    TORCH_CHECK(fd_ >= 0, "cannot open safetensors file '", path, "': ", errno_text());
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      const std::string reason = errno_text();
      ::close(fd_);
      TORCH_CHECK(false, "cannot read safetensors file '", path, "': ", reason);
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd_);
      TORCH_CHECK(false, "cannot read safetensors file '", path, "': not a regular file");
    }
    size_ = static_cast<std::uint64_t>(info.st_size);
  }
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile() { ::close(fd_); }

  std::uint64_t size() const { return size_; }

  // Reads exactly `count` bytes at `offset`; a short read means the file shrank under us.
  void read_exactly(void* out, std::uint64_t count, std::uint64_t offset,
                    const std::string& what) const {
    auto* dst = static_cast<char*>(out);
    while (count > 0) {
      const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(count, 1u << 30));
      const ssize_t n = ::pread(fd_, dst, chunk, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      TORCH_CHECK(n >= 0, "cannot read ", what, " of safetensors file '", path_,
                  "': ", errno_text());
      TORCH_CHECK(n > 0, "invalid safetensors file '", path_, "': truncated while reading ", what);
      dst += n;
      offset += static_cast<std::uint64_t>(n);
      count -= static_cast<std::uint64_t>(n);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

#define MANTISSA_CHECK_FILE(cond, ...) \
  TORCH_CHECK(cond, "invalid safetensors file '", path, "': ", __VA_ARGS__)

std::uint64_t as_offset(const nlohmann::json& value) { return value.get<std::uint64_t>(); }

// nlohmann keeps the last of two equal keys; Python's reader (serde) does that for tensor names
// and metadata entries but refuses a second "__metadata__" and a second "dtype", "shape" or
// "data_offsets" in one tensor's entry. This parser callback refuses the same.
nlohmann::json::parser_callback_t duplicate_field_check(const std::string& path) {
  struct Seen {
    std::string top_key;  // the top-level key whose value is being read
    bool metadata = false;
    std::set<std::string> fields;
  };
  auto seen = std::make_shared<Seen>();
  return [path, seen](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event != nlohmann::json::parse_event_t::key) return true;
    const auto& key = parsed.get_ref<const std::string&>();
    if (depth == 1) {
      if (key == kMetadataKey) {
        MANTISSA_CHECK_FILE(!seen->metadata, "the header has \"", kMetadataKey, "\" twice");
        seen->metadata = true;
      }
      seen->top_key = key;
      seen->fields.clear();
    } else if (depth == 2 && seen->top_key != kMetadataKey &&
               (key == "dtype" || key == "shape" || key == "data_offsets")) {
      MANTISSA_CHECK_FILE(seen->fields.insert(key).second, "the header entry of tensor '",
                          seen->top_key, "' has \"", key, "\" twice");
    }
    return true;
  };
}

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& info) {
  MANTISSA_CHECK_FILE(info.is_object(), "the header entry of tensor '", name,
                      "' is not a JSON object but ", describe_json(info));
  const auto dtype_it = info.find("dtype");
  const auto shape_it = info.find("shape");
  const auto offsets_it = info.find("data_offsets");
  MANTISSA_CHECK_FILE(dtype_it != info.end() && dtype_it->is_string(), "tensor '", name,
                      "' has no \"dtype\" string");
  MANTISSA_CHECK_FILE(shape_it != info.end() && shape_it->is_array(), "tensor '", name,
                      "' has no \"shape\" list");
  MANTISSA_CHECK_FILE(offsets_it != info.end() && offsets_it->is_array(), "tensor '", name,
                      "' has no \"data_offsets\" list");

  Entry entry;
  entry.name = name;
  const auto dtype_name = dtype_it->get<std::string>();
  const auto dtype = dtype_from_name(dtype_name);
  MANTISSA_CHECK_FILE(dtype.has_value(), "tensor '", name, "' has unknown dtype '", dtype_name,
                      "' (known: ", known_dtypes(), ")");
  entry.dtype = *dtype;
  for (const auto& dim : *shape_it) {
    MANTISSA_CHECK_FILE(
        dim.is_number_unsigned() &&
            dim.get<std::uint64_t>() <=
                static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
        "tensor '", name, "' has a bad shape ", describe_json(*shape_it),
        " (sizes must be non-negative integers)");
    entry.shape.push_back(static_cast<std::int64_t>(dim.get<std::uint64_t>()));
  }
  MANTISSA_CHECK_FILE(offsets_it->size() == 2 && (*offsets_it)[0].is_number_unsigned() &&
                          (*offsets_it)[1].is_number_unsigned(),
                      "tensor '", name, "' has bad data_offsets ", describe_json(*offsets_it),
                      " (two non-negative integers [begin, end] expected)");
  entry.begin = as_offset((*offsets_it)[0]);
  entry.end = as_offset((*offsets_it)[1]);
  MANTISSA_CHECK_FILE(entry.begin <= entry.end, "tensor '", name, "' has data_offsets [",
                      entry.begin, ", ", entry.end, "] whose end is before its begin");
  return entry;
}

Header read_header(const ReadOnlyFile& file, const std::string& path) {
  MANTISSA_CHECK_FILE(file.size() >= 8, "the file has ", file.size(),
                      " bytes, fewer than the 8-byte header length");
  unsigned char length_bytes[8];
  file.read_exactly(length_bytes, 8, 0, "the header length");
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  MANTISSA_CHECK_FILE(header_length <= file.size() - 8, "the header length is ", header_length,
                      " bytes but only ", file.size() - 8, " bytes follow it");
  MANTISSA_CHECK_FILE(header_length <= kMaxHeaderSize, "the header length ", header_length,
                      " exceeds the limit of ", kMaxHeaderSize, " bytes");

  std::string text(static_cast<std::size_t>(header_length), '\0');
  file.read_exactly(text.data(), header_length, 8, "the header");
  nlohmann::json doc;
  try {
    doc = parse_json_text<nlohmann::json>(text, kMaxJsonDepth, duplicate_field_check(path));
  } catch (const JsonTextError& e) {
    MANTISSA_CHECK_FILE(false, "the header is not valid JSON: ", e.what());
  }
  MANTISSA_CHECK_FILE(doc.is_object(), "the header is not a JSON object but ", doc.type_name());

  Header header;
  header.data_start = 8 + header_length;
  for (const auto& item : doc.items()) {
    if (item.key() == kMetadataKey) {
      // Python's reader takes null for "no metadata" (an Option in its Rust struct).
      if (item.value().is_null()) continue;
      MANTISSA_CHECK_FILE(item.value().is_object(), "\"", kMetadataKey,
                          "\" is not a JSON object (or null) but ", describe_json(item.value()));
      for (const auto& meta : item.value().items()) {
        MANTISSA_CHECK_FILE(meta.value().is_string(), "\"", kMetadataKey,
                            "\" must map strings to strings, but '", meta.key(), "' holds ",
                            describe_json(meta.value()));
        header.metadata.emplace(meta.key(), meta.value().get<std::string>());
      }
      continue;
    }
    header.entries.push_back(parse_entry(path, item.key(), item.value()));
  }
  std::sort(header.entries.begin(), header.entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });

  // The data must be the tensors back to back: each begins where the previous one ends, holds
  // exactly numel * element size bytes, and the last one ends at the end of the file.
  const std::uint64_t data_size = file.size() - header.data_start;
  std::uint64_t expected_begin = 0;
  const Entry* previous = nullptr;
  for (const auto& entry : header.entries) {
    MANTISSA_CHECK_FILE(entry.begin >= expected_begin, "tensor '", entry.name, "' (bytes [",
                        entry.begin, ", ", entry.end, ")) overlaps tensor '",
                        previous ? previous->name : "", "' (bytes [",
                        previous ? previous->begin : 0, ", ", expected_begin, "))");
    MANTISSA_CHECK_FILE(entry.begin == expected_begin, "the ", entry.begin - expected_begin,
                        " bytes before tensor '", entry.name, "' (bytes [", entry.begin, ", ",
                        entry.end, ")) belong to no tensor");
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const auto dim : entry.shape) {
      overflow |= __builtin_mul_overflow(numel, static_cast<std::uint64_t>(dim), &numel);
    }
    std::uint64_t nbytes = 0;
    overflow |= __builtin_mul_overflow(
        numel, static_cast<std::uint64_t>(c10::elementSize(entry.dtype)), &nbytes);
    MANTISSA_CHECK_FILE(!overflow && nbytes == entry.end - entry.begin, "tensor '", entry.name,
                        "' has ", entry.end - entry.begin, " bytes (data_offsets [", entry.begin,
                        ", ", entry.end, "]), but dtype ", name_of_dtype(entry.dtype),
                        " and shape ", shape_text(entry.shape), " need ",
                        overflow ? std::string("more than 2^64") : std::to_string(nbytes));
    MANTISSA_CHECK_FILE(entry.end <= data_size, "tensor '", entry.name, "' ends at byte ",
                        entry.end, " of the data, but the file holds only ", data_size,
                        " bytes of data after the header (truncated?)");
    expected_begin = entry.end;
    previous = &entry;
  }
  MANTISSA_CHECK_FILE(expected_begin == data_size, "the file has ", data_size - expected_begin,
                      " bytes after the last tensor's data (which ends at byte ", expected_begin,
                      " of ", data_size, ")");
  return header;
}

// ---------------------------------------------------------------------------------------------
// Writing

at::Tensor cpu_contiguous(const at::Tensor& tensor) {
  return tensor.detach().resolve_conj().resolve_neg().to(at::kCPU).contiguous();
}

}  // namespace safetensors_internal
using namespace safetensors_internal;

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (const auto& [key, value] : metadata) meta[key] = value;
  header[kMetadataKey] = std::move(meta);

  std::set<std::string> seen;
  std::vector<std::uint64_t> sizes;
  sizes.reserve(tensors.size());
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK_VALUE(name != kMetadataKey, "save_safetensors: '", kMetadataKey,
                      "' is reserved for the metadata and cannot name a tensor");
    TORCH_CHECK_VALUE(seen.insert(name).second, "save_safetensors: the tensor name '", name,
                      "' appears more than once; names must be unique");
    TORCH_CHECK_VALUE(tensor.defined(), "save_safetensors: tensor '", name, "' is undefined");
    TORCH_CHECK_VALUE(tensor.layout() == c10::kStrided, "save_safetensors: tensor '", name,
                      "' has layout ", tensor.layout(),
                      "; safetensors holds dense tensors only (call .to_dense() first)");
    TORCH_CHECK_VALUE(!tensor.is_meta(), "save_safetensors: tensor '", name,
                      "' is on the meta device and has no data");
    const char* dtype = name_of_dtype(tensor.scalar_type());
    TORCH_CHECK_VALUE(dtype != nullptr, "save_safetensors: tensor '", name, "' has dtype ",
                      tensor.scalar_type(),
                      ", which safetensors cannot store (supported: ", known_dtypes(), ")");
    const auto nbytes = static_cast<std::uint64_t>(tensor.numel()) * tensor.element_size();
    header[name] = {{"dtype", dtype},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    sizes.push_back(nbytes);
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // The only way dump() fails: a name or metadata string that is not valid UTF-8.
    TORCH_CHECK_VALUE(false, "save_safetensors: tensor names and metadata must be valid UTF-8 (",
                      e.what(), ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  char length_bytes[8];
  for (int i = 0; i < 8; ++i) {
    length_bytes[i] =
        static_cast<char>((static_cast<std::uint64_t>(text.size()) >> (8 * i)) & 0xff);
  }

  write_file_atomically_streamed(path, [&](const ChunkWriter& write) {
    write(std::string_view(length_bytes, 8));
    write(text);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (sizes[i] == 0) continue;
      // One CPU copy at a time: a model on the GPU never sits in host memory all at once.
      const at::Tensor cpu = cpu_contiguous(tensors[i].second);
      TORCH_INTERNAL_ASSERT(static_cast<std::uint64_t>(cpu.nbytes()) == sizes[i]);
      write(std::string_view(static_cast<const char*>(cpu.const_data_ptr()), sizes[i]));
    }
  });
}

struct SafetensorsFile::Impl {
  Impl(const std::string& p) : path(p), file(p), header(read_header(file, p)) {
    for (std::size_t i = 0; i < header.entries.size(); ++i) index.emplace(header.entries[i].name, i);
  }
  const Entry& entry(const std::string& name) const {
    const auto found = index.find(name);
    TORCH_CHECK(found != index.end(), "safetensors file '", path, "' has no tensor '", name, "'");
    return header.entries[found->second];
  }
  std::string path;
  ReadOnlyFile file;
  Header header;
  std::unordered_map<std::string, std::size_t> index;
};

SafetensorsFile::SafetensorsFile(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}
SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const std::string& SafetensorsFile::path() const { return impl_->path; }

std::vector<std::string> SafetensorsFile::keys() const {
  std::vector<std::string> names;
  names.reserve(impl_->header.entries.size());
  for (const auto& entry : impl_->header.entries) names.push_back(entry.name);
  return names;
}

bool SafetensorsFile::contains(const std::string& name) const {
  return impl_->index.count(name) != 0;
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->header.metadata;
}

c10::ScalarType SafetensorsFile::dtype(const std::string& name) const {
  return impl_->entry(name).dtype;
}

std::vector<std::int64_t> SafetensorsFile::shape(const std::string& name) const {
  return impl_->entry(name).shape;
}

at::Tensor SafetensorsFile::get_tensor(const std::string& name) const {
  const auto& entry = impl_->entry(name);
  at::Tensor tensor = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
  const std::uint64_t nbytes = entry.end - entry.begin;
  if (nbytes > 0) {
    impl_->file.read_exactly(tensor.mutable_data_ptr(), nbytes,
                             impl_->header.data_start + entry.begin, "tensor '" + name + "'");
  }
  return tensor;
}

at::Tensor SafetensorsFile::get_flat_slice(const std::string& name, std::int64_t begin,
                                           std::int64_t numel) const {
  const auto& entry = impl_->entry(name);
  const auto element = static_cast<std::uint64_t>(c10::elementSize(entry.dtype));
  const auto total = static_cast<std::int64_t>((entry.end - entry.begin) / element);
  TORCH_CHECK(begin >= 0 && numel >= 0 && begin <= total && numel <= total - begin,
              "safetensors file '", impl_->path, "': elements [", begin, ", ", begin + numel,
              ") are outside tensor '", name, "', which has ", total);
  at::Tensor tensor = at::empty({numel}, at::TensorOptions().dtype(entry.dtype));
  if (numel > 0) {
    impl_->file.read_exactly(
        tensor.mutable_data_ptr(), static_cast<std::uint64_t>(numel) * element,
        impl_->header.data_start + entry.begin + static_cast<std::uint64_t>(begin) * element,
        "tensor '" + name + "'");
  }
  return tensor;
}

std::vector<std::pair<std::string, at::Tensor>> load_safetensors(const std::string& path) {
  const SafetensorsFile file(path);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& name : file.keys()) out.emplace_back(name, file.get_tensor(name));
  return out;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  return SafetensorsFile(path).metadata();
}

}  // namespace mantissa::io
