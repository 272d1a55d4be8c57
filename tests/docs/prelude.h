#pragma once
// What the ```cpp blocks of README.md and docs/**/*.md may take for granted. The build compiles
// every such block after this header (cmake/MantissaDocSnippets.cmake; the convention is in
// docs/building.md, "Code samples in the docs").
//
// - Complete programs (blocks with `int main(`) may use `Net` and `MyDataset`.
// - Fragments (all other blocks) are compiled inside a member function of a struct derived from
//   `mantissa_docs::Context`, so they may also use its members by their bare names: `model`,
//   `optimizer`, `loader`, `x`, `y`, `loss_fn`, `fp16`, `args`, `argc`, `argv`, `max_steps`,
//   `train_dataset`, `eval_dataset`. A fragment may declare its own variable of the same name;
//   it hides the member.
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <mantissa/mantissa.h>

namespace mantissa_docs {

/// A two-layer perceptron for 28x28 images in 10 classes: `forward(x)` returns logits.
struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{784, 256}, fc2{256, 10};
  NetImpl() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x.flatten(1)))); }
};
TORCH_MODULE(Net);

/// A dataset of 64 random 28x28 "images" in 10 classes; the split name is ignored.
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

/// `torch::data::make_data_loader(MyDataset("train"), 64)`: `*loader` yields `Example<>` batches.
using Loader = std::unique_ptr<
    torch::data::StatelessDataLoader<MyDataset, torch::data::samplers::RandomSampler>>;

/// The names a fragment may use without declaring them. Never constructed: fragments are
/// compiled and linked, not run.
struct Context {
  Net model;                      // on the CPU or the GPU, fp32 unless the fragment casts it
  torch::optim::AdamW optimizer;  // over model->parameters()
  Loader loader;                  // for (auto& batch : *loader): batch.data, batch.target
  torch::Tensor x;                // one batch of inputs, [64, 1, 28, 28]
  torch::Tensor y;                // its class targets, [64]
  std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& target)> loss_fn;
  bool fp16;  // whether the run trains in fp16 (else bf16)
  mantissa::TrainingArguments args;
  int argc;
  char** argv;
  std::int64_t max_steps;
  MyDataset train_dataset;
  MyDataset eval_dataset;
};

// ---- the driver of the generated executable -----------------------------------------------

using ProgramFn = int (*)(int argc, char** argv);

/// One ```cpp block: a complete program (`program` set) or a fragment (`fragment` set).
struct Entry {
  const char* name;  // "<file>:<line of the opening fence>"
  ProgramFn program;
  void (*fragment)(Context&);
};

/// A block's `main`, with or without arguments, as a `ProgramFn`.
template <auto F>
ProgramFn program() {
  if constexpr (std::is_invocable_v<decltype(F), int, char**>) {
    return F;
  } else {
    return [](int, char**) { return F(); };
  }
}

/// `docs_snippets --list`, `docs_snippets --check`, `docs_snippets <file>:<line> [flags...]`.
inline int run_driver(const Entry* entries, std::size_t count, int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "--list" || command == "--check") {
    std::size_t programs = 0;
    std::size_t fragments = 0;
    bool ok = true;
    for (std::size_t i = 0; i < count; ++i) {
      const Entry& e = entries[i];
      if ((e.program == nullptr) == (e.fragment == nullptr)) {
        std::cerr << e.name << ": registered as neither or both a program and a fragment\n";
        ok = false;
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (std::string(entries[j].name) == e.name) {
          std::cerr << e.name << ": registered twice\n";
          ok = false;
        }
      }
      (e.program != nullptr ? programs : fragments) += 1;
      if (command == "--list")
        std::cout << (e.program != nullptr ? "program  " : "fragment ") << e.name << "\n";
    }
    if (command == "--check" && ok) {
      std::cout << "docs_snippets: " << count << " blocks compiled (" << programs << " programs, "
                << fragments << " fragments)\n";
    }
    return ok ? 0 : 1;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const Entry& e = entries[i];
    if (command != e.name) continue;
    if (e.program == nullptr) {
      std::cerr << e.name << " is a fragment: it is compiled, not run\n";
      return 2;
    }
    try {
      return e.program(argc - 1, argv + 1);  // the block's name becomes its argv[0]
    } catch (const std::exception& error) {
      std::cerr << e.name << ": " << error.what() << "\n";
      return 1;
    }
  }
  std::cerr << "usage: " << argv[0] << " --list | --check | <file>:<line> [flags...]\n";
  return 2;
}

}  // namespace mantissa_docs
