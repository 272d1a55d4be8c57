#include "corpus.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include <torch/torch.h>

// Internal headers of the library (this example is built in its tree): the regular-file check
// its own readers use, and the one way a message shortens a long path.
#include "io/atomic_file.h"
#include "shorten.h"

namespace mantissa::examples {
namespace {

std::string missing_corpus_hint(const std::string& path) {
  if (path == kJargonFilePath) {
    return "Install it with: apt-get install jargon-text (or pass --corpus with another UTF-8 text "
           "file)";
  }
  return "Pass --corpus with a UTF-8 text file, plain or gzip-compressed";
}

// At most `limit` bytes of the file's text (decompressed), so that --max_corpus_chars bounds
// the read itself; `*more` (unless null) says whether the text goes on past them. gzread reads
// plain files too, so one reader serves .gz and uncompressed text. Only a regular file is opened: a
// FIFO would block the open (and gzopen's first read), a device such as /dev/zero would never end.
std::string read_bytes(const std::string& path, std::uint64_t limit, bool* more) {
  const auto shown = mantissa::detail::shorten_path(path);
  TORCH_CHECK(::access(path.c_str(), R_OK) == 0, "corpus file '", shown,
              "' not found or not readable. ", missing_corpus_hint(path));
  try {
    mantissa::io::check_regular_file(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "corpus file: ", e.what_without_backtrace(), ". ",
                missing_corpus_hint(path));
  }
  // O_NONBLOCK: should the path have become a FIFO since the check, the open does not wait
  // for a writer, and the fstat below refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  TORCH_CHECK(fd >= 0, "cannot open corpus file '", shown, "': ", std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    TORCH_CHECK(false, "corpus file '", shown, "' is not a regular file");
  }
  gzFile file = gzdopen(fd, "rb");  // owns fd from here on
  if (file == nullptr) {
    ::close(fd);
    TORCH_CHECK(false, "cannot open corpus file '", shown, "'");
  }
  std::string bytes;
  std::array<char, 1 << 16> chunk{};
  int got = 0;  // the last gzread's: > 0 (stopped at the limit), 0 (the end) or < 0 (an error)
  while (bytes.size() < limit) {
    const auto want =
        static_cast<unsigned>(std::min<std::uint64_t>(chunk.size(), limit - bytes.size()));
    got = gzread(file, chunk.data(), want);
    if (got <= 0) break;
    bytes.append(chunk.data(), static_cast<size_t>(got));
  }
  if (more != nullptr) {
    *more = false;
    if (got > 0) {  // stopped at the limit: does the text go on?
      char next = 0;
      got = gzread(file, &next, 1);
      *more = got > 0;
    }
  }
  int code = Z_OK;
  std::string message = gzerror(file, &code);
  gzclose(file);
  // gzerror names the file as gzdopen knows it, "<fd:3>: ": the message names the path.
  if (message.rfind("<fd:", 0) == 0 && message.find(": ") != std::string::npos) {
    message.erase(0, message.find(": ") + 2);
  }
  TORCH_CHECK(got >= 0 && code == Z_OK, "corpus file '", shown, "' is truncated or corrupt (",
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
                mantissa::detail::shorten_path(path), "' is not UTF-8 text (bad byte 0x", std::hex,
                static_cast<int>(lead), std::dec, " at offset ", i, ")");
    char32_t c = length == 1 ? lead : lead & (0x7F >> length);
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(bytes[i + static_cast<size_t>(k)]);
      TORCH_CHECK((next & 0xC0) == 0x80, "corpus file '", mantissa::detail::shorten_path(path),
                  "' is not UTF-8 text (bad continuation byte at offset ",
                  i + static_cast<size_t>(k), ")");
      c = (c << 6) | (next & 0x3F);
    }
    static constexpr std::array<char32_t, 5> kMinimum{0, 0, 0x80, 0x800, 0x10000};
    TORCH_CHECK(
        c >= kMinimum[static_cast<size_t>(length)] && c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF),
        "corpus file '", mantissa::detail::shorten_path(path),
        "' is not UTF-8 text (invalid sequence at offset ", i, ")");
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
  // A character takes at most 4 bytes of UTF-8: 4 * max_chars bytes hold max_chars of them.
  constexpr std::uint64_t kMaxBytes = mantissa::io::kMaxReadFileBytes;
  const bool bounded = max_chars > 0 && static_cast<std::uint64_t>(max_chars) <= kMaxBytes / 4;
  bool more = false;
  const auto bytes = bounded ? read_bytes(path, 4 * static_cast<std::uint64_t>(max_chars), nullptr)
                             : read_bytes(path, kMaxBytes, &more);
  TORCH_CHECK_VALUE(!more, "corpus file '", mantissa::detail::shorten_path(path),
                    "' holds more than ", kMaxBytes,
                    " bytes of text; pass --max_corpus_chars (at most ", kMaxBytes / 4,
                    ") to train on its beginning");
  auto text = decode_utf8(bytes, path, max_chars);
  TORCH_CHECK(!text.empty(), "corpus file '", mantissa::detail::shorten_path(path), "' is empty. ",
              missing_corpus_hint(path));
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
  // Not numel - (block_size + 1): that overflows for a block_size near the int64 maximum.
  const auto numel = tokens_.numel();
  count_ = numel > block_size_ ? (numel - block_size_ - 1) / stride_ + 1 : 0;
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
