#include "io/zip_directory.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <c10/util/Exception.h>

namespace mantissa::io {
namespace {

constexpr std::size_t kEndRecordSize = 22;  // end of central directory, no comment
constexpr std::size_t kMaxCommentSize = 0xffff;
constexpr std::size_t kZip64LocatorSize = 20;
constexpr std::size_t kZip64EndRecordSize = 56;
constexpr std::size_t kDirectoryHeaderSize = 46;
constexpr std::uint32_t kEndSignature = 0x06054b50;
constexpr std::uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr std::uint32_t kZip64EndSignature = 0x06064b50;
constexpr std::uint32_t kDirectorySignature = 0x02014b50;
constexpr std::uint16_t kZip64ExtraId = 0x0001;
constexpr std::uint32_t kInZip64Field = 0xffffffff;  // a 32-bit field whose value is in zip64's
constexpr std::uint64_t kStored = 0;
constexpr std::uint64_t kDeflated = 8;
// Deflate's longest match (258 bytes) costs at least two bits: at most 1032 bytes out per byte
// in. LibTorch deflates its TorchScript code records; torch.save stores everything.
constexpr std::uint64_t kMaxDeflateRatio = 1032;

std::uint64_t le(const unsigned char* bytes, std::size_t width) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < width; ++i) value |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  return value;
}

bool read_exactly(const ReadAt& read, std::uint64_t pos, std::vector<unsigned char>& out,
                  std::size_t n) {
  out.resize(n);
  return n == 0 || read(pos, out.data(), n) == n;
}

struct Directory {
  std::uint64_t entries = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
};

// The central directory the end records describe; false when there is none to be found.
bool find_directory(const ReadAt& read, std::uint64_t size, Directory& directory) {
  if (size < kEndRecordSize) return false;
  const std::uint64_t tail_size = std::min<std::uint64_t>(size, kEndRecordSize + kMaxCommentSize);
  const std::uint64_t tail_start = size - tail_size;
  std::vector<unsigned char> tail;
  if (!read_exactly(read, tail_start, tail, static_cast<std::size_t>(tail_size))) return false;
  // The last signature wins, as in miniz.
  std::size_t at = tail.size() - kEndRecordSize + 1;
  do {
    --at;
    if (le(&tail[at], 4) == kEndSignature) break;
  } while (at > 0);
  if (le(&tail[at], 4) != kEndSignature) return false;
  const unsigned char* end = &tail[at];
  directory = {le(end + 10, 2), le(end + 16, 4), le(end + 12, 4)};
  if (directory.entries != 0xffff && directory.offset != kInZip64Field &&
      directory.size != kInZip64Field) {
    return true;
  }
  const std::uint64_t end_pos = tail_start + at;
  if (end_pos < kZip64LocatorSize) return false;
  std::vector<unsigned char> locator;
  if (!read_exactly(read, end_pos - kZip64LocatorSize, locator, kZip64LocatorSize) ||
      le(locator.data(), 4) != kZip64LocatorSignature) {
    return false;
  }
  std::vector<unsigned char> end64;
  if (!read_exactly(read, le(&locator[8], 8), end64, kZip64EndRecordSize) ||
      le(end64.data(), 4) != kZip64EndSignature) {
    return false;
  }
  directory = {le(&end64[32], 8), le(&end64[48], 8), le(&end64[40], 8)};
  return true;
}

}  // namespace

void check_zip_record_sizes(const ReadAt& read, std::uint64_t size, const std::string& what) {
  Directory directory;
  if (!find_directory(read, size, directory)) return;
  if (directory.offset > size || directory.size > size - directory.offset) return;
  const std::uint64_t directory_end = directory.offset + directory.size;
  std::uint64_t pos = directory.offset;
  std::vector<unsigned char> header, name, extra;
  for (std::uint64_t entry = 0; entry < directory.entries; ++entry) {
    if (directory_end - pos < kDirectoryHeaderSize ||
        !read_exactly(read, pos, header, kDirectoryHeaderSize) ||
        le(header.data(), 4) != kDirectorySignature) {
      return;
    }
    const auto method = le(&header[10], 2);
    std::array<std::uint64_t, 3> fields = {le(&header[24], 4), le(&header[20], 4),
                                           le(&header[42], 4)};  // uncompressed, compressed, offset
    const auto name_size = static_cast<std::size_t>(le(&header[28], 2));
    const auto extra_size = static_cast<std::size_t>(le(&header[30], 2));
    const auto comment_size = le(&header[32], 2);
    const std::uint64_t entry_size = kDirectoryHeaderSize + name_size + extra_size + comment_size;
    if (directory_end - pos < entry_size ||
        !read_exactly(read, pos + kDirectoryHeaderSize, name, name_size) ||
        !read_exactly(read, pos + kDirectoryHeaderSize + name_size, extra, extra_size)) {
      return;
    }
    // The zip64 extra field holds, in this order, each of the three that reads 0xffffffff.
    for (std::size_t x = 0; x + 4 <= extra.size();) {
      const auto id = le(&extra[x], 2);
      const auto length = static_cast<std::size_t>(le(&extra[x + 2], 2));
      if (id == kZip64ExtraId) {
        std::size_t value = x + 4;
        for (auto& field : fields) {
          if (field != kInZip64Field) continue;
          if (value + 8 > std::min(extra.size(), x + 4 + length)) break;
          field = le(&extra[value], 8);
          value += 8;
        }
        break;
      }
      x += 4 + length;
    }
    const std::string record(name.begin(), name.end());
    TORCH_CHECK(method == kStored || method == kDeflated, what, ": its record '", record,
                "' uses zip method ", method, "; LibTorch reads only stored and deflated records");
    const std::uint64_t uncompressed = fields[0], compressed = fields[1], offset = fields[2];
    TORCH_CHECK(offset <= size && compressed <= size - offset, what, ": its record '", record,
                "' claims ", compressed, " bytes at offset ", offset, ", past the end of the ",
                size, " bytes of the file");
    if (method == kStored) {
      TORCH_CHECK(uncompressed <= size, what, ": its record '", record, "' claims ", uncompressed,
                  " bytes, more than the ", size, " bytes of the whole file");
    } else {
      TORCH_CHECK(compressed <= size && uncompressed / kMaxDeflateRatio <= compressed, what,
                  ": its record '", record, "' claims ", uncompressed, " bytes once inflated from ",
                  compressed, ", more than deflate can make of them");
    }
    pos += entry_size;
  }
}

}  // namespace mantissa::io
