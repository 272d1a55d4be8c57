#pragma once
// The files of a checkpoint saved with fsdp_config `state_dict_type` SHARDED_STATE_DICT, and
// the readers a sharded run loads any saved state through:
//
//   checkpoint-<step>/
//     model_shards/shard-<rank>-of-<world>.safetensors      this rank's pieces of the weights
//     optimizer_shards/shard-<rank>-of-<world>.safetensors  its pieces of the optimizer state
//     optimizer_shards/param_groups.pt                      the param groups' options (rank 0)
//
// Each tensor in a shard file is one contiguous run of elements of a flattened tensor: of the
// model's state ("fc1.weight") or of the optimizer's ("fc1.weight.exp_avg", "fc1.weight.master",
// "step"). The file's metadata entry "pieces" (JSON) gives, per tensor, the whole tensor's name,
// shape and the flat offset of the piece's first element. A reader asks for elements by name and
// offset, whatever layout (world size, buckets, units) wrote them: so a checkpoint saved by 2
// processes resumes on 3. The files are plain safetensors; Python's `safe_open` reads them.
// PyTorch's Distributed Checkpoint (`.distcp` files) is the same idea in another format.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <mantissa/io/safetensors.h>
#include <mantissa/io/state_dict.h>

#include "trainer/checkpoint_faults.h"

namespace mantissa::detail::sharded {

/// The folders of a sharded checkpoint.
inline constexpr const char* kModelShardsFolder = "model_shards";
inline constexpr const char* kOptimizerShardsFolder = "optimizer_shards";
/// The optimizer's param group options (betas, eps, weight decay, ...) in optimizer_shards/: a
/// LibTorch archive of `param_group_options_bytes`, written by rank 0.
inline constexpr const char* kParamGroupsFile = "param_groups.pt";

/// "shard-00001-of-00002.safetensors" for rank 1 of 2.
std::string shard_file_name(std::int64_t rank, std::int64_t world_size);

/// Whether `checkpoint_dir` holds a sharded checkpoint (a model_shards folder).
bool is_sharded_checkpoint(const std::string& checkpoint_dir);

/// One piece of a flattened tensor, to be written.
struct TensorPiece {
  std::string name;                 ///< the whole tensor's name
  at::Tensor values;                ///< the piece's elements (1-D, or 0-d for a 0-d tensor)
  std::vector<std::int64_t> shape;  ///< the whole tensor's shape
  std::int64_t offset = 0;          ///< the flat index of the piece's first element
};

/// Writes `pieces` as `folder/shard_file_name(rank, world_size)`, atomically (the folder is made
/// when missing), `faults` seeing the path first. Throws `c10::ValueError` for a piece that
/// does not fit its shape or a name given twice. Syncs (copies to the host).
void write_shard_file(const std::string& folder, std::int64_t rank, std::int64_t world_size,
                      const std::vector<TensorPiece>& pieces, const FileFaults& faults = {});

/// Saved tensors a loader reads elements of, by name: whole tensors (a model.safetensors, or a
/// state in memory) or the pieces of a folder of shard files. Reads are host-side.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  /// Every tensor's name, sorted.
  virtual std::vector<std::string> names() const = 0;
  /// Whether a tensor `name` was saved.
  virtual bool contains(const std::string& name) const = 0;
  /// Tensor `name`'s shape and dtype (call only when `contains(name)`).
  virtual std::vector<std::int64_t> shape(const std::string& name) const = 0;
  virtual c10::ScalarType dtype(const std::string& name) const = 0;
  /// Elements [offset, offset + numel) of tensor `name` flattened, as a 1-D CPU tensor; a
  /// `c10::Error` naming the tensor and the elements no piece holds, when some are missing.
  virtual at::Tensor read(const std::string& name, std::int64_t offset,
                          std::int64_t numel) const = 0;
  /// What the source is, for errors: " from '<path>'".
  virtual std::string origin() const = 0;

  /// The number of elements of tensor `name`.
  std::int64_t numel(const std::string& name) const;
  /// Tensor `name`, whole, in its shape.
  at::Tensor read_whole(const std::string& name) const;
};

/// The whole tensors of one safetensors file (model.safetensors), read in ranges.
class SafetensorsSource final : public TensorSource {
 public:
  explicit SafetensorsSource(const std::string& path) : file_(path) {}
  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override { return file_.contains(name); }
  std::vector<std::int64_t> shape(const std::string& name) const override {
    return file_.shape(name);
  }
  c10::ScalarType dtype(const std::string& name) const override { return file_.dtype(name); }
  at::Tensor read(const std::string& name, std::int64_t offset,
                  std::int64_t numel) const override {
    return file_.get_flat_slice(name, offset, numel);
  }
  std::string origin() const override { return " from '" + file_.path() + "'"; }

 private:
  io::SafetensorsFile file_;
};

/// Whole tensors in memory (a state a caller passes to `load_model_state_dict`).
class NamedTensorsSource final : public TensorSource {
 public:
  /// `state` must outlive the source; `origin` as `TensorSource::origin`.
  NamedTensorsSource(const io::NamedTensors& state, std::string origin);
  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override { return index_.count(name) != 0; }
  std::vector<std::int64_t> shape(const std::string& name) const override;
  c10::ScalarType dtype(const std::string& name) const override;
  at::Tensor read(const std::string& name, std::int64_t offset,
                  std::int64_t numel) const override;
  std::string origin() const override { return origin_; }

 private:
  std::map<std::string, at::Tensor> index_;
  std::string origin_;
};

/// The pieces in a folder of shard files (`model_shards/`, `optimizer_shards/`).
class ShardFolderSource final : public TensorSource {
 public:
  /// Opens every `shard-<r>-of-<N>.safetensors` of `folder` and reads their headers (not their
  /// data). A `c10::Error` naming what is wrong: no such folder, no shard file, files of
  /// different N, a missing rank's file (named, with the processes that saved them), metadata
  /// that does not describe the file's tensors, or two pieces of one tensor that overlap.
  explicit ShardFolderSource(const std::string& folder);
  ~ShardFolderSource() override;
  /// The number of processes that wrote the folder.
  std::int64_t world_size() const noexcept { return world_size_; }

  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  std::vector<std::int64_t> shape(const std::string& name) const override;
  c10::ScalarType dtype(const std::string& name) const override;
  at::Tensor read(const std::string& name, std::int64_t offset,
                  std::int64_t numel) const override;
  std::string origin() const override { return " from '" + folder_ + "'"; }

 private:
  struct Piece {
    std::size_t file = 0;   // index into files_
    std::string key;        // its name in that file
    std::int64_t offset = 0;
    std::int64_t numel = 0;
  };
  struct Saved {
    std::vector<std::int64_t> shape;
    c10::ScalarType dtype = c10::kFloat;
    std::vector<Piece> pieces;  // by offset
  };
  std::string folder_;
  std::int64_t world_size_ = 0;
  std::vector<io::SafetensorsFile> files_;
  std::map<std::string, Saved> tensors_;
};

}  // namespace mantissa::detail::sharded
