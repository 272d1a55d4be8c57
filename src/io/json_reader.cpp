#include "io/json_reader.h"

#include "shorten.h"

#include <string>
#include <vector>

namespace mantissa::io {
namespace {

// nlohmann's parse errors quote the token they stopped at, which can be a whole unterminated
// string of a hostile file; a message keeps this many characters of it.
constexpr std::size_t kMaxParseMessage = 240;

// One pass over the text, with no recursion: the nesting depth of brackets outside strings
// (exact for valid JSON, which is all nlohmann accepts afterwards) and any NUL byte.
void check_shape_of_text(std::string_view text, std::size_t max_depth) {
  // nlohmann skips a leading byte-order mark; Python's json and serde_json refuse one.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") {
    throw JsonTextError("a UTF-8 byte-order mark at offset 0 (JSON text must not start with one)");
  }
  std::size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0') {
      throw JsonTextError("a NUL byte at offset " + std::to_string(i) +
                          " (JSON allows none, not even as padding after the value)");
    }
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          throw JsonTextError("arrays and objects nest deeper than " + std::to_string(max_depth) +
                              " levels (the bracket at offset " + std::to_string(i) +
                              " opens level " + std::to_string(depth) + ")");
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
}

}  // namespace

template <class Json>
Json parse_json_text(std::string_view text, std::size_t max_depth,
                     const typename Json::parser_callback_t& callback) {
  check_shape_of_text(text, max_depth);
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const typename Json::exception& e) {  // parse_error, or out_of_range for 1e400
    throw JsonTextError(detail::shorten(e.what(), kMaxParseMessage));
  }
}

template <class Json>
std::string describe_json(const Json& value, std::size_t max_chars) {
  using String = typename Json::string_t;
  std::string out;
  const auto full = [&] { return out.size() > max_chars; };
  // A string is cut before it is quoted, so a 100 MB string costs no 100 MB copy.
  const auto emit_string = [&](const String& text) {
    String head = text.size() > max_chars ? text.substr(0, max_chars + 1) : text;
    out += Json(std::move(head)).dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  const auto emit_scalar = [&](const Json& item) {
    if (item.is_string()) {
      emit_string(item.template get_ref<const String&>());
    } else {
      out += item.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
  };

  struct Frame {
    const Json* node;
    typename Json::const_iterator next;
  };
  std::vector<Frame> stack;
  const auto open = [&](const Json& item) {
    if (item.is_object() || item.is_array()) {
      out += item.is_object() ? '{' : '[';
      stack.push_back({&item, item.cbegin()});
    } else {
      emit_scalar(item);
    }
  };

  open(value);
  while (!stack.empty() && !full()) {
    Frame& top = stack.back();
    const Json& node = *top.node;
    if (top.next == node.cend()) {
      out += node.is_object() ? '}' : ']';
      stack.pop_back();
      continue;
    }
    if (top.next != node.cbegin()) out += ',';
    const auto item = top.next++;
    if (node.is_object()) {
      emit_string(item.key());
      out += ':';
    }
    open(*item);  // may grow `stack`; `top` is not used after this
  }
  // Unfinished: marked "..." even where what was written fits in `max_chars`.
  if (full() || !stack.empty()) {
    return out.size() > max_chars ? detail::shorten(out, max_chars) : out + "...";
  }
  return out;
}

template nlohmann::json parse_json_text<nlohmann::json>(std::string_view, std::size_t,
                                                        const nlohmann::json::parser_callback_t&);
template nlohmann::ordered_json parse_json_text<nlohmann::ordered_json>(
    std::string_view, std::size_t, const nlohmann::ordered_json::parser_callback_t&);
template std::string describe_json<nlohmann::json>(const nlohmann::json&, std::size_t);
template std::string describe_json<nlohmann::ordered_json>(const nlohmann::ordered_json&,
                                                           std::size_t);

}  // namespace mantissa::io
