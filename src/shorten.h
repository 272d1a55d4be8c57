#pragma once
// The one way a message shows a value that can be long (a path, a string from a file or the
// command line): its first characters and "...", so a hostile 5000-character value costs a
// line of stderr, not pages.

#include <cstddef>
#include <string>
#include <string_view>

namespace mantissa::detail {

/// How much of a long value a message shows by default (docs/hostile_inputs.md promises the
/// first 80 or so characters).
inline constexpr std::size_t kShownChars = 80;

/// `text` itself when it has at most `max_chars` bytes; otherwise its first `max_chars` bytes,
/// cut back to the start of a UTF-8 sequence so that no character is split, then "...".
/// Python has no equivalent (`reprlib.Repr` comes closest). No device sync.
inline std::string shorten(std::string_view text, std::size_t max_chars = kShownChars) {
  if (text.size() <= max_chars) return std::string(text);
  std::size_t end = max_chars;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return std::string(text.substr(0, end)) + "...";
}

/// A path of at most `max_chars` bytes itself; a longer one as its start, "..." and its end
/// (about a third and two thirds of `max_chars`), each cut at a UTF-8 boundary: the end names
/// the file. No device sync.
inline std::string shorten_path(std::string_view path, std::size_t max_chars = kShownChars) {
  if (path.size() <= max_chars) return std::string(path);
  const std::size_t head_chars = max_chars / 3;
  std::size_t tail = path.size() - (max_chars - head_chars);
  while (tail < path.size() && (static_cast<unsigned char>(path[tail]) & 0xC0) == 0x80) ++tail;
  return shorten(path, head_chars) + std::string(path.substr(tail));
}

}  // namespace mantissa::detail
