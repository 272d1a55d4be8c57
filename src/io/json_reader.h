#pragma once
// Reading JSON from outside bytes (safetensors headers, training_args.json,
// trainer_state.json) without trusting its shape, and describing a bad value in an error
// message without printing all of it.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mantissa::io {

/// The deepest nesting of arrays and objects the readers accept: 127, the most that Python's
/// safetensors reader (serde_json, whose recursion limit is 128) accepts. No file mantissa
/// reads needs more than 4.
inline constexpr std::size_t kMaxJsonDepth = 127;

/// What `parse_json_text` throws: the text is not JSON, nests too deep or holds a NUL byte.
/// `what()` says which, and where (a byte offset or nlohmann's line and column).
class JsonTextError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parses `text` as one JSON value, surrounded by nothing but JSON whitespace.
///
/// Before handing the text to nlohmann, one non-recursive pass checks that arrays and objects
/// nest at most `max_depth` levels (outside strings), that no NUL byte appears anywhere and
/// that the text does not start with a UTF-8 byte-order mark: nlohmann stops reading at a NUL
/// (so it would accept `{}\0anything`) and skips a byte-order mark, where Python's `json` and
/// serde_json refuse both. Throws `JsonTextError`; whatever `callback` (nlohmann's parser callback,
/// for checks of the reader's own) throws passes through. `Json` is `nlohmann::json` or
/// `nlohmann::ordered_json`.
template <class Json>
Json parse_json_text(std::string_view text, std::size_t max_depth = kMaxJsonDepth,
                     const typename Json::parser_callback_t& callback = nullptr);

/// A short, single-line rendering of `value` for an error message: compact JSON as
/// `dump()` writes it while it fits in about `max_chars` characters, cut with "..." after
/// that. Never recurses and never builds more than `max_chars` plus a few characters, whatever
/// the size or depth of `value`.
template <class Json>
std::string describe_json(const Json& value, std::size_t max_chars = 80);

}  // namespace mantissa::io
