#pragma once
// The text a causal LM trains on, as run_clm.py prepares it: token ids, concatenated and cut
// into block_size chunks (the remainder dropped), with labels equal to the inputs (the model
// shifts them). Two inputs: a token file written by prepare_tokens.py (any tokenizer), or any
// other file read as bytes (ids 0-255), plain or gzip-compressed.

#include <cstdint>
#include <string>

#include <torch/data/datasets/base.h>
#include <torch/types.h>

#include <mantissa/batch.h>

namespace mantissa::examples::llama {

/// The first bytes of a token file: "MTSTOK01". The header is 32 bytes, little-endian:
/// magic[8], uint32 bytes per id (2 or 4), uint32 0 (reserved), uint64 the number of ids,
/// uint64 the tokenizer's vocabulary size; then the ids, back to back (llm.c's .bin layout,
/// with a header of our own).
inline constexpr char kTokenFileMagic[8] = {'M', 'T', 'S', 'T', 'O', 'K', '0', '1'};

/// Token ids read from a file, and what kind of file it was.
struct TokenIds {
  torch::Tensor ids;            ///< int64 [n], on the CPU
  std::int64_t vocab_size = 0;  ///< the token file's, or 256 for bytes
  bool from_token_file = false;
};

/// Reads `path`: a token file (by its magic) as its ids, anything else as bytes (gzip files are
/// decompressed first). Python: `prepare_tokens.py`'s output read back, or
/// `list(open(path, "rb").read())`. Raises c10::Error naming the file when it is missing, not a
/// regular file, empty, corrupt, or a token file whose header disagrees with its size or whose
/// ids reach its vocabulary size. CPU only.
TokenIds read_token_ids(const std::string& path);

/// The examples of a causal LM: `ids` cut into rows of `block_size` (the rest dropped), each
/// row both `input_ids` and `labels`. Python: run_clm.py's `group_texts`. A batch dataset for
/// the Trainer (a batch is one index_select).
class TokenBlocks : public torch::data::datasets::BatchDataset<TokenBlocks, mantissa::Batch> {
 public:
  /// `max_blocks` > 0 keeps only the first ones (run_clm's --max_train_samples).
  TokenBlocks(const torch::Tensor& ids, std::int64_t block_size, std::int64_t max_blocks = 0);

  mantissa::Batch get_batch(c10::ArrayRef<size_t> indices) override;
  torch::optional<size_t> size() const override;
  /// [blocks, block_size] int64.
  const torch::Tensor& blocks() const { return blocks_; }

 private:
  torch::Tensor blocks_;
};

}  // namespace mantissa::examples::llama
