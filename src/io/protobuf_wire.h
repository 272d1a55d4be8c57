#pragma once
// A protocol-buffer encoder for the handful of field kinds TensorBoard's event messages use:
// varints, 64- and 32-bit little-endian numbers, and length-delimited bytes (strings and nested
// messages). Internal; the messages themselves are spelled out in tensorboard_event.cpp.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace mantissa::io::detail {

/// Appends fields in protobuf's wire format (developers.google.com/protocol-buffers, "Encoding")
/// to a byte string. Fields are written in the order given; a reader accepts any order. Host
/// code only.
class ProtoWriter {
 public:
  /// int32/int64/uint64/bool/enum (wire type 0). Negative int64 values take ten bytes, as in
  /// protobuf's own encoder.
  ProtoWriter& varint_field(int field, std::uint64_t value) {
    key(field, 0);
    varint(value);
    return *this;
  }
  /// `double` (wire type 1).
  ProtoWriter& double_field(int field, double value) {
    std::uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    key(field, 1);
    little_endian(bits, 8);
    return *this;
  }
  /// `float` (wire type 5).
  ProtoWriter& float_field(int field, float value) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    key(field, 5);
    little_endian(bits, 4);
    return *this;
  }
  /// `string`, `bytes` or an encoded nested message (wire type 2).
  ProtoWriter& bytes_field(int field, std::string_view bytes) {
    key(field, 2);
    varint(bytes.size());
    out_.append(bytes.data(), bytes.size());
    return *this;
  }

  /// The encoded message so far.
  const std::string& bytes() const noexcept { return out_; }
  /// Hands the encoded message over, leaving the writer empty.
  std::string take() { return std::move(out_); }

 private:
  void key(int field, int wire_type) {
    varint((static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint64_t>(wire_type));
  }
  void varint(std::uint64_t value) {
    while (value >= 0x80) {
      out_.push_back(static_cast<char>((value & 0x7f) | 0x80));
      value >>= 7;
    }
    out_.push_back(static_cast<char>(value));
  }
  void little_endian(std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }

  std::string out_;
};

}  // namespace mantissa::io::detail
