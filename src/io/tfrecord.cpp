#include "io/tfrecord.h"

#include <algorithm>
#include <climits>

#include <isa-l/crc.h>

namespace mantissa::io::detail {
namespace {

void append_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::uint32_t crc32c(std::string_view data) {
  // ISA-L's iSCSI CRC takes the running register; the standard CRC-32C starts from all ones and
  // inverts the result. Its length is an int: feed larger buffers in pieces.
  std::uint32_t crc = 0xffffffffu;
  auto* bytes = reinterpret_cast<unsigned char*>(const_cast<char*>(data.data()));
  std::size_t left = data.size();
  while (left > 0) {
    const auto n = std::min<std::size_t>(left, INT_MAX);
    crc = crc32_iscsi(bytes, static_cast<int>(n), crc);
    bytes += n;
    left -= n;
  }
  return crc ^ 0xffffffffu;
}

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_le(out, data.size(), 8);
  append_le(out, masked_crc32c(std::string_view(out.data(), 8)), 4);
  out.append(data.data(), data.size());
  append_le(out, masked_crc32c(data), 4);
  return out;
}

}  // namespace mantissa::io::detail
