#include "io/pickle_scan.h"

#include <cstdint>
#include <cstring>
#include <optional>

#include <c10/util/Exception.h>

namespace mantissa::io {
namespace {

// How an opcode's argument is laid out in the stream (Python's Lib/pickletools.py names the
// same layouts: uint1, uint4, decimalnl_short, string1, unicodestring4, ...).
enum class Argument {
  kNone,
  kFixed,          // `width` bytes
  kLengthPrefixed, // a little-endian length of `width` bytes, then that many bytes
  kLines,          // `width` newline-terminated lines
};

struct Layout {
  Argument argument = Argument::kNone;
  std::size_t width = 0;
  bool stores_memo = false;  // BINPUT, LONG_BINPUT: the argument is a memo id
};

// Every opcode of pickle protocols 0 to 5; nullopt for a byte that is none.
std::optional<Layout> layout_of(std::uint8_t opcode) {
  switch (opcode) {
    // No argument.
    case '(': case '.': case '0': case '1': case '2': case 'N': case 'R': case 'a': case 'b':
    case 'd': case '}': case 'e': case 'l': case ']': case 'o': case 's': case 't': case ')':
    case 'u': case 'Q':
    case 0x81: case 0x85: case 0x86: case 0x87: case 0x88: case 0x89: case 0x8f: case 0x90:
    case 0x91: case 0x92: case 0x93: case 0x94: case 0x97: case 0x98:
      return Layout{};
    // Fixed-width arguments.
    case 'K': case 'h': case 0x80: case 0x82: return Layout{Argument::kFixed, 1};
    case 'M': case 0x83: return Layout{Argument::kFixed, 2};
    case 'J': case 'j': case 0x84: return Layout{Argument::kFixed, 4};
    case 'G': case 0x95: return Layout{Argument::kFixed, 8};
    case 'q': return Layout{Argument::kFixed, 1, /*stores_memo=*/true};
    case 'r': return Layout{Argument::kFixed, 4, /*stores_memo=*/true};
    // Length-prefixed strings, bytes and longs.
    case 'U': case 'C': case 0x8c: case 0x8a: return Layout{Argument::kLengthPrefixed, 1};
    case 'T': case 'X': case 'B': case 0x8b: return Layout{Argument::kLengthPrefixed, 4};
    case 0x8d: case 0x8e: case 0x96: return Layout{Argument::kLengthPrefixed, 8};
    // Text arguments of protocol 0.
    case 'I': case 'L': case 'F': case 'S': case 'V': case 'P': case 'g': case 'p':
      return Layout{Argument::kLines, 1};
    case 'c': case 'i': return Layout{Argument::kLines, 2};
    default:
      return std::nullopt;
  }
}

std::uint64_t little_endian(const char* bytes, std::size_t width) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < width; ++i) {
    value |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

// "0x8d": how pickletools and the unpickler's errors show an opcode.
std::string opcode_name(std::uint8_t opcode) {
  static const char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[opcode >> 4] + kDigits[opcode & 0xf];
}

}  // namespace

void check_pickle_is_bounded(const char* data, std::size_t size, const std::string& where) {
  std::size_t pos = 0;
  std::uint64_t memo_size = 0;  // one past the highest memo id stored so far
  while (pos < size) {
    const std::size_t at = pos;
    const auto opcode = static_cast<std::uint8_t>(data[pos++]);
    const auto layout = layout_of(opcode);
    if (!layout || opcode == '.') return;
    const std::size_t left = size - pos;
    const auto cut = [&] {
      TORCH_CHECK(false, where, " is cut inside the argument of its pickle opcode ",
                  opcode_name(opcode), " at byte ", at);
    };
    switch (layout->argument) {
      case Argument::kNone:
        break;
      case Argument::kFixed: {
        if (left < layout->width) cut();
        if (layout->stores_memo) {
          const std::uint64_t id = little_endian(data + pos, layout->width);
          TORCH_CHECK(id <= memo_size, where, " stores memo entry ", id, " at byte ", at,
                      " of its pickle while only ", memo_size,
                      " entries exist; picklers number them in order");
          if (id == memo_size) ++memo_size;
        }
        pos += layout->width;
      } break;
      case Argument::kLengthPrefixed: {
        if (left < layout->width) cut();
        const std::uint64_t length = little_endian(data + pos, layout->width);
        pos += layout->width;
        TORCH_CHECK(length <= size - pos, where, " claims ", length, " bytes for the argument of",
                    " its pickle opcode ", opcode_name(opcode), " at byte ", at, ", but only ",
                    size - pos, " bytes follow");
        pos += static_cast<std::size_t>(length);
      } break;
      case Argument::kLines: {
        for (std::size_t line = 0; line < layout->width; ++line) {
          const void* newline = std::memchr(data + pos, '\n', size - pos);
          if (newline == nullptr) cut();
          pos = static_cast<std::size_t>(static_cast<const char*>(newline) - data) + 1;
        }
      } break;
    }
  }
}

}  // namespace mantissa::io
