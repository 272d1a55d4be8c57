#pragma once
// Stand-ins for what the README's snippet leaves to the reader, so the build can compile the
// snippet exactly as the README shows it (examples/CMakeLists.txt extracts it).
#include <iostream>
#include <string>

#include <torch/torch.h>

/// A dataset of 64 random 28x28 "images" in 10 classes.
class MyDataset : public torch::data::datasets::BatchDataset<MyDataset, torch::data::Example<>> {
 public:
  explicit MyDataset(const std::string& /*split*/)
      : images_(torch::rand({64, 1, 28, 28})), labels_(torch::randint(10, {64}, torch::kLong)) {}
  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override {
    auto index = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()), torch::kLong);
    return {images_.index_select(0, index), labels_.index_select(0, index)};
  }
  torch::optional<size_t> size() const override { return 64; }

 private:
  torch::Tensor images_;
  torch::Tensor labels_;
};
