#include "corpus.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>

#include <torch/torch.h>

namespace mantissa::examples {
namespace {

std::string missing_corpus_hint(const std::string& path) {
  if (path == kJargonFilePath) {
    return "Install it with: apt-get install jargon-text (or pass --corpus with another UTF-8 text "
           "file)";
  }
  return "Pass --corpus with a UTF-8 text file, plain or gzip-compressed";
}

// gzread reads plain files too, so one reader serves .gz and uncompressed text.
std::string read_bytes(const std::string& path) {
  TORCH_CHECK(::access(path.c_str(), R_OK) == 0, "corpus file '", path,
              "' not found or not readable. ", missing_corpus_hint(path));
  gzFile file = gzopen(path.c_str(), "rb");
  TORCH_CHECK(file != nullptr, "cannot open corpus file '", path, "'");
  std::string bytes;
  std::array<char, 1 << 16> chunk{};
  int got = 0;
  while ((got = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()))) > 0) {
    bytes.append(chunk.data(), static_cast<size_t>(got));
  }
  int code = Z_OK;
  const std::string message = gzerror(file, &code);
  gzclose(file);
  TORCH_CHECK(got == 0 && code == Z_OK, "corpus file '", path, "' is truncated or corrupt (",
              message, ")");
  return bytes;
}

// UTF-8 to code points; stops after max_chars (> 0). Rejects malformed and overlong sequences.
std::u32string decode_utf8(const std::string& bytes, const std::string& path,
                           std::int64_t max_chars) {
  std::u32string text;
  text.reserve(max_chars > 0 ? static_cast<size_t>(max_chars) : bytes.size());
  size_t i = 0;
  while (i < bytes.size() &&
         (max_chars <= 0 || static_cast<std::int64_t>(text.size()) < max_chars)) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    const int length = lead < 0x80           ? 1
                       : (lead >> 5) == 0x6  ? 2
                       : (lead >> 4) == 0xE  ? 3
                       : (lead >> 3) == 0x1E ? 4
                                             : 0;
    TORCH_CHECK(length > 0 && i + static_cast<size_t>(length) <= bytes.size(), "corpus file '",
                path, "' is not UTF-8 text (bad byte 0x", std::hex, static_cast<int>(lead),
                std::dec, " at offset ", i, ")");
    char32_t c = length == 1 ? lead : lead & (0x7F >> length);
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(bytes[i + static_cast<size_t>(k)]);
      TORCH_CHECK((next & 0xC0) == 0x80, "corpus file '", path,
                  "' is not UTF-8 text (bad continuation byte at offset ",
                  i + static_cast<size_t>(k), ")");
      c = (c << 6) | (next & 0x3F);
    }
    static constexpr std::array<char32_t, 5> kMinimum{0, 0, 0x80, 0x800, 0x10000};
    TORCH_CHECK(
        c >= kMinimum[static_cast<size_t>(length)] && c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF),
        "corpus file '", path, "' is not UTF-8 text (invalid sequence at offset ", i, ")");
    text.push_back(c);
    i += static_cast<size_t>(length);
  }
  return text;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace

std::u32string read_corpus(const std::string& path, std::int64_t max_chars) {
  TORCH_CHECK_VALUE(max_chars >= 0, "max_corpus_chars must be >= 0, got ", max_chars);
  auto text = decode_utf8(read_bytes(path), path, max_chars);
  TORCH_CHECK(!text.empty(), "corpus file '", path, "' is empty. ", missing_corpus_hint(path));
  return text;
}

CharVocabulary::CharVocabulary(const std::u32string& text) : chars_(text) {
  std::sort(chars_.begin(), chars_.end());
  chars_.erase(std::unique(chars_.begin(), chars_.end()), chars_.end());
  id_of_.assign(chars_.empty() ? 0 : static_cast<size_t>(chars_.back()) + 1, -1);
  for (size_t id = 0; id < chars_.size(); ++id) id_of_[chars_[id]] = static_cast<std::int64_t>(id);
}

torch::Tensor CharVocabulary::encode(const std::u32string& text) const {
  auto ids = torch::empty({static_cast<std::int64_t>(text.size())}, torch::kLong);
  auto* out = ids.data_ptr<std::int64_t>();
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    const std::int64_t id = c < id_of_.size() ? id_of_[c] : -1;
    TORCH_CHECK_VALUE(id >= 0, "character U+", std::hex, static_cast<std::uint32_t>(c),
                      " is not in the vocabulary");
    out[i] = id;
  }
  return ids;
}

std::string CharVocabulary::decode(const torch::Tensor& ids) const {
  const auto flat = ids.to(torch::kCPU, torch::kLong).contiguous().flatten();
  std::string out;
  for (const auto id : c10::ArrayRef<std::int64_t>(flat.data_ptr<std::int64_t>(),
                                                   static_cast<size_t>(flat.numel()))) {
    TORCH_CHECK_VALUE(id >= 0 && id < size(), "token id ", id, " is outside the vocabulary of ",
                      size());
    append_utf8(out, chars_[static_cast<size_t>(id)]);
  }
  return out;
}

TokenWindows::TokenWindows(torch::Tensor tokens, std::int64_t block_size, std::int64_t stride)
    : tokens_(std::move(tokens)), block_size_(block_size), stride_(stride) {
  TORCH_CHECK_VALUE(tokens_.dim() == 1, "TokenWindows: tokens must be 1-d, got ", tokens_.sizes());
  TORCH_CHECK_VALUE(block_size_ > 0 && stride_ > 0, "TokenWindows: block_size (", block_size_,
                    ") and stride (", stride_, ") must be positive");
  const auto span = tokens_.numel() - (block_size_ + 1);
  count_ = span < 0 ? 0 : span / stride_ + 1;
}

mantissa::Batch TokenWindows::get_batch(c10::ArrayRef<size_t> indices) {
  auto starts =
      torch::tensor(std::vector<std::int64_t>(indices.begin(), indices.end()), torch::kLong) *
      stride_;
  auto positions = starts.unsqueeze(1) + torch::arange(block_size_ + 1, torch::kLong).unsqueeze(0);
  auto windows = tokens_.index_select(0, positions.flatten()).view({-1, block_size_ + 1});
  using torch::indexing::None;
  using torch::indexing::Slice;
  return {{"input_ids", windows.index({Slice(), Slice(0, -1)}).contiguous()},
          {"labels", windows.index({Slice(), Slice(1, None)}).contiguous()}};
}

torch::optional<size_t> TokenWindows::size() const { return static_cast<size_t>(count_); }

}  // namespace mantissa::examples
