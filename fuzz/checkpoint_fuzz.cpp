// Fuzz target: resuming from a checkpoint folder in which one file holds the input.
//
// At start-up the real save_checkpoint writes a valid checkpoint of a tiny bf16 model (with
// fp32 master weights, AdamW state after one step, a linear schedule, an enabled GradScaler).
// Each input's first byte picks one of the files load_checkpoint reads; the rest of the input
// replaces that file, and load_checkpoint restores everything into fresh objects. A refusal
// (any std::exception) is fine; a crash or a sanitizer report is a finding.
//
// With MANTISSA_FUZZ_WRITE_SEEDS=<dir> in the environment the target writes each original file,
// behind its selector byte, into <dir> (the seed corpus in fuzz/corpus/checkpoint was made so).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>
#include "io/filesystem.h"

#include "fuzz_util.h"
#include "io/atomic_file.h"
#include "trainer/checkpoint.h"

namespace {

// The selector byte's meaning: input[0] % kFiles.size().
const std::vector<std::string> kFiles = {
    "scaler.pt",         "scheduler.pt",       "rng_state.pth",    "optimizer.pt",
    "master_weights.pt", "trainer_state.json", "model.safetensors"};

// Everything a checkpoint restores into, built the same way for the save and for each load.
struct Run {
  torch::nn::Linear model{nullptr};
  std::unique_ptr<mantissa::amp::MasterWeights> masters;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::unique_ptr<mantissa::LrScheduler> scheduler;
  std::unique_ptr<mantissa::amp::GradScaler> scaler;
  mantissa::TrainerState state;
  mantissa::TrainingArguments args;

  Run() {
    model = torch::nn::Linear(3, 2);
    model->to(torch::kBFloat16);
    masters = std::make_unique<mantissa::amp::MasterWeights>(*model);
    optimizer = std::make_unique<torch::optim::AdamW>(masters->master_params(),
                                                      torch::optim::AdamWOptions(1e-3));
    scheduler = std::make_unique<mantissa::LrScheduler>(*optimizer, "linear", 1, 10);
    scaler = std::make_unique<mantissa::amp::GradScaler>();
    args.bf16(true).use_cpu(true);
  }

  mantissa::detail::CheckpointParts parts() {
    mantissa::detail::CheckpointParts p;
    p.model = model.get();
    p.masters = masters.get();
    p.optimizer = optimizer.get();
    p.scheduler = scheduler.get();
    p.scaler = scaler.get();
    p.state = &state;
    p.args = &args;
    return p;
  }
};

struct Checkpoint {
  std::string dir;
  std::vector<std::string> originals;  // kFiles' bytes as saved
};

const Checkpoint& checkpoint() {
  static const Checkpoint saved = [] {
    Run run;
    // One step, so that the optimizer and the scheduler have state to save.
    const auto x = torch::randn({4, 3}, torch::kBFloat16);
    run.model->forward(x).to(torch::kFloat).pow(2).mean().backward();
    run.masters->copy_grads_to_masters();
    run.optimizer->step();
    run.masters->copy_masters_to_model();
    run.scheduler->step();
    run.state.global_step = 1;
    run.state.max_steps = 10;
    run.state.log_history = {{{"loss", 0.5}, {"step", 1}}};
    Checkpoint out;
    out.dir = mantissa::detail::save_checkpoint(mantissa_fuzz::scratch_dir(), run.parts());
    for (const auto& name : kFiles) {
      const auto bytes = mantissa::io::read_file(mantissa::io::join_path(out.dir, name));
      out.originals.emplace_back(bytes.begin(), bytes.end());
    }
    if (const char* seeds = std::getenv("MANTISSA_FUZZ_WRITE_SEEDS")) {
      mantissa::io::create_directories(seeds);
      for (std::size_t i = 0; i < kFiles.size(); ++i) {
        mantissa_fuzz::write_bytes(mantissa::io::join_path(seeds, "valid-" + kFiles[i]),
                                   std::string(1, static_cast<char>(i)) + out.originals[i]);
      }
    }
    return out;
  }();
  return saved;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Checkpoint& saved = checkpoint();
  if (size == 0) return 0;
  const std::size_t which = data[0] % kFiles.size();
  const std::string path = mantissa::io::join_path(saved.dir, kFiles[which]);
  mantissa_fuzz::write_bytes(path,
                             std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  Run run;
  mantissa_fuzz::expect_no_crash(
      [&] { mantissa::detail::load_checkpoint(saved.dir, run.parts()); });
  mantissa_fuzz::write_bytes(path, saved.originals[which]);
  return 0;
}
