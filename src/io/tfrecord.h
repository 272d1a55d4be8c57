#pragma once
// TFRecord framing, the container of TensorBoard's event files: each record is its length
// (uint64, little-endian), the masked CRC32C of those 8 bytes, the data, and the masked CRC32C
// of the data. Internal.

#include <cstdint>
#include <string>
#include <string_view>

namespace mantissa::io::detail {

/// CRC-32C (Castagnoli) of `data`, as iSCSI and TFRecord define it ("123456789" -> 0xE3069283).
/// Computed by Intel ISA-L (`crc32_iscsi`), which picks the CPU's CRC instructions at run time.
std::uint32_t crc32c(std::string_view data);

/// TFRecord's masked CRC: the CRC rotated right by 15 bits plus 0xa282ead8, so that a CRC of
/// data that itself holds CRCs does not degenerate.
std::uint32_t masked_crc32c(std::string_view data);

/// `data` framed as one TFRecord record (16 bytes longer than `data`).
std::string frame_record(std::string_view data);

}  // namespace mantissa::io::detail
