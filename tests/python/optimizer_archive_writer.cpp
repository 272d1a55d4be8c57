// The C++ side of tests/python/test_optimizer_archives.py: runs one of the optimizers of
// docs/optimizers.md, built by the registry as the Trainer builds it, for a few steps on fixed
// parameters and gradients, and writes its optimizer.pt, so that Python's loaders
// (mantissa.optim.load_adafactor_pt, load_muon_pt, load_adamw_8bit_pt) read the C++ file.
//
//   optimizer_archive_writer OPTIM DIR [--optim_args TEXT]
//     DIR/optimizer.pt          the optimizer's archive after kSteps steps
//     DIR/params.safetensors    the parameters after those steps (named as below)
//
// The parameters (in the model's order): "embed.weight" [32, 16], "w" [64, 64], "b" [64],
// each `sin(0.1 * i + k)` / 2 over its flat index i (k its position); the gradient of step s
// (from 1) is `cos(0.05 * i + s + k)` / 10. Learning rate 1e-2, weight decay 0.1, HF's two
// weight-decay groups ("w" and "embed.weight" decay). Exits 0 on success, 1 with a message.
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <mantissa/io/safetensors.h>
#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/training_arguments.h>

#include "io/atomic_file.h"

namespace {

constexpr int kSteps = 4;

at::Tensor wave(const std::vector<std::int64_t>& shape, double rate, double offset, double scale) {
  auto n = 1;
  for (const auto d : shape) n *= static_cast<int>(d);
  return (torch::arange(n, torch::kFloat).mul(rate).add(offset).sin() * scale).view(shape);
}

int run(const std::string& optim, const std::string& dir, const std::string& optim_args) {
  const std::vector<std::string> names{"embed.weight", "w", "b"};
  const std::vector<std::vector<std::int64_t>> shapes{{32, 16}, {64, 64}, {64}};
  std::vector<at::Tensor> params;
  for (std::size_t k = 0; k < names.size(); ++k) {
    params.push_back(wave(shapes[k], 0.1, static_cast<double>(k), 0.5).requires_grad_());
  }
  auto args = mantissa::TrainingArguments().optim(optim).learning_rate(1e-2).weight_decay(0.1);
  if (!optim_args.empty()) args.optim_args(optim_args);
  args.validate();
  mantissa::optim::OptimizerBuildInputs inputs{args, {}, /*first_group_decays=*/true};
  inputs.groups.emplace_back(std::vector<at::Tensor>{params[0], params[1]});
  inputs.groups.emplace_back(std::vector<at::Tensor>{params[2]});
  inputs.group_names = {{names[0], names[1]}, {names[2]}};
  auto optimizer = mantissa::optim::find_optimizer(optim)->build(std::move(inputs));
  for (int step = 1; step <= kSteps; ++step) {
    for (std::size_t k = 0; k < params.size(); ++k) {
      params[k].mutable_grad() = wave(shapes[k], 0.05, step + static_cast<double>(k), 0.1);
    }
    optimizer->step();
  }
  torch::serialize::OutputArchive archive;
  optimizer->save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  mantissa::io::write_file_atomically(dir + "/optimizer.pt", bytes.str());
  mantissa::io::NamedTensors saved;
  for (std::size_t k = 0; k < names.size(); ++k) saved.emplace_back(names[k], params[k].detach());
  mantissa::io::save_safetensors(dir + "/params.safetensors", saved);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && !(argc == 5 && std::string(argv[3]) == "--optim_args")) {
    std::cerr << "usage: optimizer_archive_writer OPTIM DIR [--optim_args TEXT]" << std::endl;
    return 2;
  }
  try {
    return run(argv[1], argv[2], argc == 5 ? argv[4] : "");
  } catch (const std::exception& error) {
    std::cerr << "optimizer_archive_writer: " << error.what() << std::endl;
    return 1;
  }
}
