#pragma once
// A text corpus as a sequence of character ids: reading (gzip or plain UTF-8), the vocabulary
// of its characters, and the windows a character-level language model trains on.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <mantissa/batch.h>

namespace mantissa::examples {

/// The Jargon File (public domain), as Debian's `jargon-text` package installs it: 1.6 M
/// characters of English prose, gzip-compressed. The default corpus of `char_gpt`.
inline constexpr const char* kJargonFilePath = "/usr/share/doc/jargon-text/jargon.txt.gz";

/// Reads a UTF-8 text file, gzip-compressed or plain, into Unicode code points; at most
/// `max_chars` of them when `max_chars > 0`. A missing, unreadable, corrupt or non-UTF-8 file
/// raises a c10::Error naming the path (and, for the default corpus, the package to install).
std::u32string read_corpus(const std::string& path, std::int64_t max_chars = 0);

/// The distinct characters of a text, sorted, and the maps between them and token ids.
class CharVocabulary {
 public:
  explicit CharVocabulary(const std::u32string& text);

  std::int64_t size() const { return static_cast<std::int64_t>(chars_.size()); }
  /// The text as token ids, int64 [text.size()]. A character not in the vocabulary raises.
  torch::Tensor encode(const std::u32string& text) const;
  /// Token ids (any integer tensor) back to UTF-8.
  std::string decode(const torch::Tensor& ids) const;

 private:
  std::u32string chars_;
  std::vector<std::int64_t> id_of_;  // indexed by code point; -1 when absent
};

/// Windows of `block_size + 1` consecutive tokens of a token sequence, as batches of
/// `input_ids` = tokens [s, s + block_size) and `labels` = tokens [s + 1, s + block_size + 1)
/// (the next token at each position). A batch dataset for the Trainer: a batch is gathered
/// with one index_select.
///
/// `stride` 1 makes every start position an example, so the Trainer's seeded shuffle draws
/// random windows (training); `stride` = block_size tiles the sequence without overlap, so
/// each token is scored once (evaluation).
class TokenWindows : public torch::data::datasets::BatchDataset<TokenWindows, mantissa::Batch> {
 public:
  TokenWindows(torch::Tensor tokens, std::int64_t block_size, std::int64_t stride);

  mantissa::Batch get_batch(c10::ArrayRef<size_t> indices) override;
  torch::optional<size_t> size() const override;

 private:
  torch::Tensor tokens_;
  std::int64_t block_size_;
  std::int64_t stride_;
  std::int64_t count_;
};

}  // namespace mantissa::examples
