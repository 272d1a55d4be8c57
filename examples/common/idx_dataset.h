#pragma once
// Reading IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or not, into tensors.

#include <string>

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

namespace mantissa::examples {

/// Where Debian's `dataset-fashion-mnist` package puts the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Reads an IDX file (`.gz` or plain) into a uint8 tensor of the shape its header gives.
/// A missing, truncated or corrupt file raises a c10::Error naming the path.
torch::Tensor read_idx(const std::string& path);

/// Fashion-MNIST's train (60000) or test (10000) split: images as float [N, 1, 28, 28] in
/// [0, 1] normalised with the train mean/std, labels as int64 [N]. A batch dataset: a batch is
/// gathered with one index_select instead of stacking single examples, so
/// `torch::data::make_data_loader(FashionMnist(...), batch_size)` yields `Example<>` batches.
class FashionMnist
    : public torch::data::datasets::BatchDataset<FashionMnist, torch::data::Example<>> {
 public:
  enum class Split { kTrain, kTest };

  /// Reads `<dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`. A missing file raises an
  /// error naming it and the Debian package to install.
  FashionMnist(const std::string& dir, Split split);

  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override;
  torch::optional<size_t> size() const override;

  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& targets() const { return targets_; }

 private:
  torch::Tensor images_;
  torch::Tensor targets_;
};

}  // namespace mantissa::examples
