#include "token_data.h"

#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <zlib.h>

#include "io/atomic_file.h"

namespace mantissa::examples::llama {
namespace {

constexpr std::size_t kHeaderBytes = 32;
// The most bytes read from one file (decompressed): 8 GiB.
constexpr std::uint64_t kMaxBytes = std::uint64_t{8} << 30;

std::uint64_t little_endian(const unsigned char* bytes, int width) {
  std::uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// The whole file, decompressed when it is gzip (gzread passes plain files through).
std::string read_all(const std::string& path) {
  io::check_regular_file(path);  // a FIFO or a device would block or never end
  gzFile file = gzopen(path.c_str(), "rb");
  TORCH_CHECK(file != nullptr, "cannot open '", path, "': ", std::strerror(errno));
  std::string bytes;
  std::array<char, 1 << 16> chunk{};
  int got = 0;
  while ((got = gzread(file, chunk.data(), chunk.size())) > 0) {
    bytes.append(chunk.data(), static_cast<std::size_t>(got));
    if (bytes.size() > kMaxBytes) {
      gzclose(file);
      TORCH_CHECK(false, "'", path, "' holds more than ", kMaxBytes, " bytes");
    }
  }
  int code = Z_OK;
  const std::string message = gzerror(file, &code);
  gzclose(file);
  TORCH_CHECK(got == 0 && code == Z_OK, "'", path, "' is truncated or corrupt (", message, ")");
  return bytes;
}

TokenIds parse_token_file(const std::string& bytes, const std::string& path) {
  TORCH_CHECK(bytes.size() >= kHeaderBytes, "token file '", path, "': ", bytes.size(),
              " bytes are too few for its 32-byte header");
  const auto* header = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto width = little_endian(header + 8, 4);
  const auto reserved = little_endian(header + 12, 4);
  const auto count = little_endian(header + 16, 8);
  const auto vocab = little_endian(header + 24, 8);
  TORCH_CHECK(width == 2 || width == 4, "token file '", path,
              "': bytes per id must be 2 (uint16) or 4 (uint32), the header says ", width);
  TORCH_CHECK(reserved == 0, "token file '", path, "': header field 12..15 must be 0, got ",
              reserved, " (a newer format?)");
  TORCH_CHECK(vocab > 0 && vocab <= (width == 2 ? 65536u : 4294967296ull), "token file '", path,
              "': vocabulary size ", vocab, " does not fit ids of ", width, " bytes");
  const auto payload = bytes.size() - kHeaderBytes;
  TORCH_CHECK(count <= payload / width && count * width == payload, "token file '", path,
              "': the header promises ", count, " ids of ", width, " bytes, the file holds ",
              payload, " bytes after the header");
  TORCH_CHECK(count > 0, "token file '", path, "' holds no token ids");
  const auto* data = header + kHeaderBytes;
  auto ids = torch::empty({static_cast<std::int64_t>(count)}, torch::kLong);
  auto* out = ids.data_ptr<std::int64_t>();
  for (std::uint64_t i = 0; i < count; ++i) {
    const auto id = little_endian(data + i * width, static_cast<int>(width));
    TORCH_CHECK(id < vocab, "token file '", path, "': id ", id, " at position ", i,
                " is not below the vocabulary size ", vocab);
    out[i] = static_cast<std::int64_t>(id);
  }
  return {ids, static_cast<std::int64_t>(vocab), true};
}

}  // namespace

TokenIds read_token_ids(const std::string& path) {
  const auto bytes = read_all(path);
  TORCH_CHECK(!bytes.empty(), "'", path, "' is empty");
  if (bytes.size() >= sizeof kTokenFileMagic &&
      std::memcmp(bytes.data(), kTokenFileMagic, sizeof kTokenFileMagic) == 0) {
    return parse_token_file(bytes, path);
  }
  auto ids = torch::empty({static_cast<std::int64_t>(bytes.size())}, torch::kLong);
  auto* out = ids.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<unsigned char>(bytes[i]);
  return {ids, 256, false};
}

TokenBlocks::TokenBlocks(const torch::Tensor& ids, std::int64_t block_size,
                         std::int64_t max_blocks) {
  TORCH_CHECK_VALUE(ids.dim() == 1, "token ids must be 1-d, got ", ids.sizes());
  TORCH_CHECK_VALUE(block_size > 0, "block_size must be positive, got ", block_size);
  auto count = ids.numel() / block_size;
  if (max_blocks > 0) count = std::min(count, max_blocks);
  blocks_ = ids.narrow(0, 0, count * block_size).view({count, block_size}).contiguous();
}

mantissa::Batch TokenBlocks::get_batch(c10::ArrayRef<size_t> indices) {
  const auto rows = blocks_.index_select(
      0, torch::tensor(std::vector<std::int64_t>(indices.begin(), indices.end()), torch::kLong));
  return {{"input_ids", rows}, {"labels", rows}};
}

torch::optional<size_t> TokenBlocks::size() const { return static_cast<size_t>(blocks_.size(0)); }

}  // namespace mantissa::examples::llama
