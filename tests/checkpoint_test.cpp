// Hostile and mismatched checkpoints: every value a resumed run reads is checked against the
// run, each error names the file and the value, non-regular files are refused without blocking,
// and interrupted saves and rotations are cleaned up by the next save.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <mantissa/optim/fused_adamw.h>
#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/trainer.h>
#include "io/filesystem.h"

#include "io/atomic_file.h"
#include "io/torch_save.h"
#include "io_test_util.h"
#include "toy_training.h"
#include "trainer/checkpoint.h"
#include "trainer/optimizer_state_table.h"

namespace {

using mantissa::Trainer;
using mantissa::TrainingArguments;
using mantissa_test::make_toy_model;
using mantissa_test::toy_args;
using mantissa_test::ToyDataset;
using mantissa_test::WarningCapture;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

std::string read_text(const std::string& path) {
  const auto bytes = mantissa::io::read_file(path);
  return std::string(bytes.begin(), bytes.end());
}

void write_text(const std::string& path, const std::string& text) {
  mantissa::io::write_file_atomically(path, text);
}

// A run of 4 optimizer steps (13 batches of 8 make an epoch) that saves checkpoint-4.
struct SavedRun {
  std::string dir;
  std::string checkpoint;
  TrainingArguments args;
  std::string file(const char* name) const { return checkpoint + "/" + name; }
};

SavedRun saved_run(bool fp16 = false) {
  SavedRun run;
  run.dir = mantissa_test::toy_output_dir();
  run.args = toy_args(run.dir).max_steps(4).save_strategy("steps").save_steps(4).fp16(fp16);
  Trainer(make_toy_model(), run.args, ToyDataset(100)).train();
  run.checkpoint = run.dir + "/checkpoint-4";
  return run;
}

// Resumes `run` from its checkpoint with `args` (the saved ones, to 8 steps, by default).
void resume(const SavedRun& run, std::optional<TrainingArguments> args = std::nullopt) {
  Trainer(make_toy_model(), args.value_or(TrainingArguments(run.args).max_steps(8)),
          ToyDataset(100))
      .train(run.checkpoint);
}

// Rewrites one key of trainer_state.json (a dotted key reaches into "mantissa").
void edit_state(const SavedRun& run, const std::string& key, const nlohmann::json& value) {
  auto doc = nlohmann::json::parse(read_text(run.file("trainer_state.json")));
  if (key.rfind("mantissa.", 0) == 0) {
    doc["mantissa"][key.substr(9)] = value;
  } else {
    doc[key] = value;
  }
  write_text(run.file("trainer_state.json"), doc.dump(2));
}

// Rewrites one entry of a torch.save dict file (scaler.pt, scheduler.pt).
void edit_pickle(const std::string& path, const std::string& key, const c10::IValue& value) {
  auto dict = torch::pickle_load(mantissa::io::read_file(path)).toGenericDict();
  dict.insert_or_assign(key, value);
  const auto bytes = mantissa::io::torch_save_bytes(dict);
  write_text(path, std::string(bytes.data(), bytes.size()));
}

TEST(CheckpointTest, PositionOutsideTheRunIsAnErrorNamingTheFile) {
  const auto run = saved_run();
  const auto state_file = run.file("trainer_state.json");
  const auto original = read_text(state_file);
  for (const std::int64_t bad : {std::int64_t{-7}, std::int64_t{-1000000000}, std::int64_t{14}}) {
    SCOPED_TRACE(bad);
    write_text(state_file, original);
    edit_state(run, "mantissa.steps_in_epoch", bad);
    EXPECT_THAT([&] { resume(run); },
                ThrowsMessage<c10::ValueError>(
                    AllOf(HasSubstr("cannot load checkpoint file '" + state_file + "'"),
                          HasSubstr("steps_in_epoch"), HasSubstr(std::to_string(bad)))));
  }
  for (const std::int64_t bad : {std::int64_t{-5}, std::int64_t{9}}) {
    SCOPED_TRACE(bad);
    write_text(state_file, original);
    edit_state(run, "global_step", bad);
    EXPECT_THAT([&] { resume(run); },
                ThrowsMessage<c10::ValueError>(AllOf(
                    HasSubstr(state_file), HasSubstr("'global_step' is " + std::to_string(bad)))));
  }
  write_text(state_file, original);
  edit_state(run, "global_step", 1e30);
  EXPECT_THAT([&] { resume(run); },
              ThrowsMessage<c10::ValueError>(HasSubstr("must be an integer")));
  // Nothing was overwritten by the refused runs.
  write_text(state_file, original);
  EXPECT_EQ(mantissa::detail::sorted_checkpoints(run.dir),
            std::vector<std::string>{run.checkpoint});
}

TEST(CheckpointTest, ResumingAtMaxStepsTrainsNoStep) {
  const auto run = saved_run();
  Trainer again(make_toy_model(), run.args, ToyDataset(100));
  again.train(run.checkpoint);
  EXPECT_EQ(again.state().global_step, 4);
  for (const auto& entry : again.state().log_history) EXPECT_LE(entry.at("step"), 4.0);
  EXPECT_THAT(read_text(run.dir + "/trainer_log.jsonl"), Not(HasSubstr("\"step\":5")));
}

TEST(CheckpointTest, LoadErrorsCarryNoBacktrace) {
  const auto run = saved_run();
  write_text(run.file("trainer_state.json"), "{ not json");
  try {
    resume(run);
    FAIL() << "a corrupt trainer_state.json was accepted";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_THAT(message, HasSubstr("trainer_state.json"));
    EXPECT_THAT(message, Not(HasSubstr("Exception raised from")));
    EXPECT_THAT(message, Not(HasSubstr("frame #")));
  }
}

TEST(CheckpointTest, ScalerStateThatCannotScaleIsAnError) {
  const auto run = saved_run(/*fp16=*/true);
  const auto scaler_file = run.file("scaler.pt");
  const auto original = read_text(scaler_file);
  for (const double bad : {0.0, std::nan(""), std::numeric_limits<double>::infinity(), -1.0}) {
    SCOPED_TRACE(bad);
    write_text(scaler_file, original);
    edit_pickle(scaler_file, "scale", bad);
    EXPECT_THAT(
        [&] { resume(run, TrainingArguments(run.args).max_steps(8)); },
        ThrowsMessage<c10::ValueError>(AllOf(HasSubstr(scaler_file), HasSubstr("'scale' is"))));
  }
  write_text(scaler_file, original);
  edit_pickle(scaler_file, "_growth_tracker", std::int64_t{-3});
  EXPECT_THAT([&] { resume(run); },
              ThrowsMessage<c10::ValueError>(HasSubstr("'_growth_tracker' is -3")));
}

TEST(CheckpointTest, SchedulerStateOutOfRangeIsAnError) {
  const auto run = saved_run();
  const auto scheduler_file = run.file("scheduler.pt");
  const auto original = read_text(scheduler_file);
  c10::impl::GenericList nan_rates(c10::AnyType::get());
  nan_rates.push_back(std::nan(""));
  nan_rates.push_back(1e-2);
  edit_pickle(scheduler_file, "base_lrs", nan_rates);
  EXPECT_THAT([&] { resume(run); },
              ThrowsMessage<c10::ValueError>(
                  AllOf(HasSubstr(scheduler_file), HasSubstr("'base_lrs'[0] is nan"))));
  write_text(scheduler_file, original);
  edit_pickle(scheduler_file, "last_epoch", std::int64_t{-50});
  EXPECT_THAT([&] { resume(run); },
              ThrowsMessage<c10::ValueError>(
                  AllOf(HasSubstr(scheduler_file), HasSubstr("'last_epoch' is -50"))));
}

TEST(CheckpointTest, OptimizerStateOfAnotherShapeIsAnError) {
  const auto run = saved_run();
  // The same groups and counts as the toy model's (weights, then biases), other shapes.
  std::vector<torch::Tensor> weights{torch::zeros({8, 16}, torch::requires_grad()),
                                     torch::zeros({16, 4}, torch::requires_grad())};
  std::vector<torch::Tensor> biases{torch::zeros({16}, torch::requires_grad()),
                                    torch::zeros({4}, torch::requires_grad())};
  std::vector<torch::optim::OptimizerParamGroup> groups{torch::optim::OptimizerParamGroup(weights),
                                                        torch::optim::OptimizerParamGroup(biases)};
  torch::optim::AdamW other(groups, torch::optim::AdamWOptions(1e-2));
  for (auto& p : weights) p.mutable_grad() = torch::ones_like(p);
  for (auto& p : biases) p.mutable_grad() = torch::ones_like(p);
  other.step();
  torch::serialize::OutputArchive archive;
  other.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  write_text(run.file("optimizer.pt"), bytes.str());
  EXPECT_THAT([&] { resume(run); },
              ThrowsMessage<c10::ValueError>(AllOf(HasSubstr(run.file("optimizer.pt")),
                                                   HasSubstr("has shape [8, 16]"),
                                                   HasSubstr("the parameter has shape [16, 8]"))));
}

// Loads `run`'s optimizer.pt into a FusedAdamW (the default optim) of the toy model, lets `edit`
// change it, and writes it back: what a script that edits the file makes.
void edit_optimizer(const SavedRun& run,
                    const std::function<void(mantissa::optim::FusedAdamW&)>& edit) {
  Trainer trainer(make_toy_model(), run.args, ToyDataset(100));
  auto& optimizer = dynamic_cast<mantissa::optim::FusedAdamW&>(trainer.optimizer());
  torch::serialize::InputArchive in;
  in.load_from(run.file("optimizer.pt"));
  optimizer.load(in);
  edit(optimizer);
  torch::serialize::OutputArchive out;
  optimizer.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  write_text(run.file("optimizer.pt"), bytes.str());
}

// The state of the first parameter (fc1.weight, [16, 8]).
mantissa::optim::FusedAdamWParamState& first_state(mantissa::optim::FusedAdamW& optimizer) {
  const auto& param = optimizer.param_groups().at(0).params().at(0);
  return static_cast<mantissa::optim::FusedAdamWParamState&>(
      *optimizer.state().at(param.unsafeGetTensorImpl()));
}

mantissa::optim::FusedAdamWOptions& first_options(mantissa::optim::FusedAdamW& optimizer) {
  return static_cast<mantissa::optim::FusedAdamWOptions&>(optimizer.param_groups().at(0).options());
}

TEST(CheckpointTest, OptimizerStateNoRunCanHaveIsAnErrorNamingTheValue) {
  const auto run = saved_run();
  const auto file = run.file("optimizer.pt");
  const auto original = read_text(file);
  using Edit = std::function<void(mantissa::optim::FusedAdamW&)>;
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<Edit, std::string>> cases = {
      {[&](auto& o) { first_options(o).lr(nan); }, "param_groups[0]: 'lr' is nan"},
      {[](auto& o) { first_options(o).lr(-1.0); },
       "param_groups[0]: 'lr' is -1, but it must be a finite number >= 0"},
      {[](auto& o) {
         first_options(o).betas({0.9, 1.5});
       },
       "'betas[1]' is 1.5, but it must be a finite number in [0, 1)"},
      {[&](auto& o) { first_options(o).eps(inf); }, "'eps' is inf"},
      {[&](auto& o) { first_options(o).weight_decay(nan); }, "'weight_decay' is nan"},
      {[](auto& o) { first_state(o).step(torch::full({}, -3.0)); },
       "the state 'step' of parameter 0 is -3"},
      {[](auto& o) { first_state(o).exp_avg_sq().view(-1)[5] = -0.5; },
       "the state 'exp_avg_sq' of parameter 0 holds negative values: 1 of its 128 values (the "
       "first, -0.5, at flat index 5)"},
      {[&](auto& o) { first_state(o).exp_avg().view(-1)[2] = nan; },
       "the state 'exp_avg' of parameter 0 holds NaN or infinite values: 1 of its 128 values "
       "(the first, nan, at flat index 2)"},
      {[](auto& o) { first_state(o).exp_avg(first_state(o).exp_avg().to(torch::kInt)); },
       "the state 'exp_avg' of parameter 0 is Int, not a floating-point tensor"},
  };
  for (const auto& [edit, message] : cases) {
    SCOPED_TRACE(message);
    write_text(file, original);
    edit_optimizer(run, edit);
    EXPECT_THAT([&] { resume(run); },
                ThrowsMessage<c10::ValueError>(AllOf(
                    HasSubstr("cannot load checkpoint file '" + file + "'"), HasSubstr(message))));
  }
  // Untouched, it resumes.
  write_text(file, original);
  EXPECT_NO_THROW(resume(run));
}

TEST(CheckpointTest, NonFiniteMasterWeightsAreAnErrorNamingTheValue) {
  const auto dir = mantissa_test::toy_output_dir();
  const auto args = toy_args(dir).max_steps(4).save_strategy("steps").save_steps(4);
  auto bf16_model = [] {
    auto model = make_toy_model();
    model->to(torch::kBFloat16);
    return model;
  };
  Trainer(bf16_model(), args, ToyDataset(100)).train();
  const auto file = dir + "/checkpoint-4/master_weights.pt";
  ASSERT_TRUE(mantissa::io::path_exists(file));
  torch::serialize::InputArchive in;
  in.load_from(file);
  torch::serialize::OutputArchive out;
  torch::Tensor size;
  in.read("masters/size", size);
  out.write("masters/size", size);
  for (std::int64_t i = 0; i < size.item<std::int64_t>(); ++i) {
    torch::Tensor master;
    in.read("masters/" + std::to_string(i), master, /*is_buffer=*/true);
    if (i == 1) master.view(-1)[3] = std::nan("");
    out.write("masters/" + std::to_string(i), master, /*is_buffer=*/true);
  }
  std::ostringstream bytes;
  out.save_to(bytes);
  write_text(file, bytes.str());
  EXPECT_THAT(
      [&] {
        Trainer(bf16_model(), TrainingArguments(args).max_steps(8), ToyDataset(100))
            .train(dir + "/checkpoint-4");
      },
      ThrowsMessage<c10::ValueError>(
          AllOf(HasSubstr("cannot load checkpoint file '" + file + "'"),
                HasSubstr("master 1 holds NaN or infinite values: 1 of its 16 values (the first, "
                          "nan, at flat index 3)"))));
}

// What a checkpoint of `trainer`'s run holds, with `state`, `scaler` and `args` standing in for
// the Trainer's own (tests change them).
mantissa::detail::CheckpointParts parts_of(Trainer& trainer, torch::nn::Module& model,
                                           mantissa::TrainerState& state,
                                           mantissa::amp::GradScaler& scaler,
                                           const TrainingArguments& args) {
  mantissa::detail::CheckpointParts parts;
  parts.model = &model;
  parts.optimizer = &trainer.optimizer();
  parts.scheduler = &trainer.lr_scheduler();
  parts.scaler = &scaler;
  parts.state = &state;
  parts.args = &args;
  return parts;
}

// Faults that record the name of each checkpoint file written into `written`, and fail the
// write of `fail_at` (when given) as a full disk does.
mantissa::detail::FileFaults recording_writes(std::vector<std::string>& written,
                                              const char* fail_at = nullptr) {
  mantissa::detail::FileFaults faults;
  faults.before_write = [&written, fail_at](const std::string& path) {
    written.push_back(path.substr(path.rfind('/') + 1));
    if (fail_at != nullptr && path.find(fail_at) != std::string::npos) {
      throw std::runtime_error("No space left on device (simulated)");
    }
  };
  return faults;
}

TEST(CheckpointTest, ARankTheSavingRunDidNotHaveStartsItsRandomStateAfresh) {
  // A checkpoint of one process (rng_state.pth), restored as rank 0 and rank 1 of 2.
  const auto run = saved_run();
  const auto saved_state =
      torch::pickle_load(mantissa::io::read_file(run.file("rng_state.pth"))).toGenericDict();
  auto load_as = [&](std::int64_t rank) {
    auto model = make_toy_model();
    Trainer trainer(model, TrainingArguments(run.args).max_steps(8), ToyDataset(100));
    auto state = trainer.state();
    mantissa::amp::GradScaler scaler(mantissa::amp::GradScalerOptions().enabled(false));  // fp32
    auto parts = parts_of(trainer, *model, state, scaler, run.args);
    parts.process_index = rank;
    parts.num_processes = 2;
    torch::manual_seed(12345);  // not the saved state
    mantissa::detail::load_checkpoint(run.checkpoint, parts);
  };
  load_as(0);
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(),
                           saved_state.at("cpu").toTensor()))
      << "rank 0 restores the lone process's rng_state.pth";
  WarningCapture warnings;
  load_as(1);
  EXPECT_THAT(warnings.messages,
              Contains(AllOf(HasSubstr("holds the random states of 1 process(es), and this run "
                                       "has 2: process 1 was not among them"),
                             HasSubstr("starts afresh"))));
  // The file of a process the saving run had is required.
  ASSERT_EQ(::unlink(run.file("rng_state.pth").c_str()), 0);
  mantissa::detail::write_rng_state(run.checkpoint, 0, 2);  // says 2 processes saved
  EXPECT_THAT([&] { load_as(1); },
              ThrowsMessage<c10::Error>(
                  AllOf(HasSubstr("rng_state_1.pth' is missing: 2 process(es) saved '"),
                        HasSubstr("process 1 among them"))));
  // The pure rule.
  using mantissa::detail::rng_state_to_restore;
  EXPECT_EQ(rng_state_to_restore(0, 2, 1), std::optional<std::string>("rng_state.pth"));
  EXPECT_EQ(rng_state_to_restore(1, 2, 1), std::nullopt);
  EXPECT_EQ(rng_state_to_restore(0, 1, 2), std::optional<std::string>("rng_state_0.pth"));
  EXPECT_EQ(rng_state_to_restore(2, 3, 0), std::optional<std::string>("rng_state_2.pth"));
  EXPECT_EQ(rng_state_to_restore(0, 1, 0), std::optional<std::string>("rng_state.pth"));
}

TEST(CheckpointTest, TheSameGlobalBatchCutOtherwiseResumesFromItsStep) {
  // Saved at batch 8 x accumulation 1; resumed at 4 x 2: the same 8 examples per step.
  const auto run = saved_run();
  WarningCapture warnings;
  Trainer trainer(make_toy_model(),
                  TrainingArguments(run.args)
                      .max_steps(8)
                      .per_device_train_batch_size(4)
                      .gradient_accumulation_steps(2),
                  ToyDataset(100));
  trainer.train(run.checkpoint);
  EXPECT_EQ(trainer.state().global_step, 8);
  EXPECT_THAT(warnings.messages,
              Contains(AllOf(HasSubstr("per_device_train_batch_size is 4 now but was 8"),
                             HasSubstr("is 4 x 1 x 2 = 8 now and was 8 x 1 x 1 = 8"))));
}

TEST(CheckpointTest, NonRegularFilesAreRefusedWithoutBlocking) {
  const auto run = saved_run();
  const auto state_file = run.file("trainer_state.json");
  const auto model_file = run.file("model.safetensors");
  const auto state_copy = read_text(state_file);
  ASSERT_EQ(::unlink(state_file.c_str()), 0);
  ASSERT_EQ(::symlink("/dev/zero", state_file.c_str()), 0);
  EXPECT_THAT([&] { resume(run); }, ThrowsMessage<c10::Error>(AllOf(
                                        HasSubstr(state_file), HasSubstr("a character device"))));
  ASSERT_EQ(::unlink(state_file.c_str()), 0);
  ASSERT_EQ(::mkfifo(state_file.c_str(), 0600), 0);
  EXPECT_THAT([&] { resume(run); },
              ThrowsMessage<c10::Error>(AllOf(HasSubstr(state_file), HasSubstr("a FIFO"))));
  ASSERT_EQ(::unlink(state_file.c_str()), 0);
  write_text(state_file, state_copy);
  ASSERT_EQ(::unlink(model_file.c_str()), 0);
  ASSERT_EQ(::mkfifo(model_file.c_str(), 0600), 0);
  EXPECT_THAT([&] { resume(run); },
              ThrowsMessage<c10::Error>(AllOf(HasSubstr(model_file), HasSubstr("a FIFO"))));
}

TEST(CheckpointTest, ATrainingArgsJsonThatIsALinkLoopIsAnError) {
  // training_args.json is read on resume, so a loop of links there is named, not skipped.
  const auto run = saved_run();
  const auto args_file = run.file("training_args.json");
  ASSERT_EQ(::unlink(args_file.c_str()), 0);
  ASSERT_EQ(::symlink(args_file.c_str(), args_file.c_str()), 0);
  EXPECT_THAT([&] { resume(run); },
              ThrowsMessage<c10::Error>(
                  AllOf(HasSubstr(args_file), HasSubstr("a symbolic link that leads to no file"))));
}

TEST(CheckpointTest, CheckpointPathThatIsAFileSaysSo) {
  const auto run = saved_run();
  EXPECT_THAT(
      [&] { Trainer(make_toy_model(), run.args, ToyDataset(100)).train(run.file("scheduler.pt")); },
      ThrowsMessage<c10::ValueError>(HasSubstr("is not a folder")));
  EXPECT_THAT(
      [&] {
        Trainer(make_toy_model(), run.args, ToyDataset(100)).train(run.dir + "/checkpoint-99");
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("does not exist")));
}

TEST(CheckpointTest, ArgumentsThatMoveTheDataPositionAreErrors) {
  const auto run = saved_run();
  const auto batch = TrainingArguments(run.args).max_steps(8).per_device_train_batch_size(4);
  EXPECT_THAT([&] { resume(run, batch); },
              ThrowsMessage<c10::ValueError>(
                  AllOf(HasSubstr("per_device_train_batch_size is 4 now but was 8"),
                        HasSubstr("cannot resume from '" + run.checkpoint + "'"))));
  const auto accumulation = TrainingArguments(run.args).max_steps(8).gradient_accumulation_steps(2);
  EXPECT_THAT(
      [&] { resume(run, accumulation); },
      ThrowsMessage<c10::ValueError>(HasSubstr("gradient_accumulation_steps is 2 now but was 1")));
  // A checkpoint of HF's layout has no training_args.json: trainer_state.json's batch size decides.
  ASSERT_EQ(::unlink(run.file("training_args.json").c_str()), 0);
  EXPECT_THAT([&] { resume(run, batch); },
              ThrowsMessage<c10::ValueError>(HasSubstr("'train_batch_size' 8, but this run has "
                                                       "per_device_train_batch_size 4")));
}

TEST(CheckpointTest, HarmlessChangedArgumentsWarnAndThisRunsValuesApply) {
  const auto run = saved_run();
  WarningCapture warnings;
  Trainer trainer(make_toy_model(),
                  TrainingArguments(run.args).max_steps(8).save_steps(3).logging_steps(2),
                  ToyDataset(100));
  trainer.train(run.checkpoint);
  EXPECT_EQ(trainer.state().save_steps, 3);
  EXPECT_EQ(trainer.state().logging_steps, 2);
  EXPECT_TRUE(mantissa::io::is_directory(run.dir + "/checkpoint-6"));
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_THAT(warnings.messages[0], AllOf(HasSubstr("save_steps is 3.0 now but was 4.0"),
                                          HasSubstr("logging_steps is 2.0 now but was 5.0"),
                                          HasSubstr("max_steps is 8 now but was 4"),
                                          HasSubstr("this run's value is used")));
}

TEST(CheckpointTest, FailedLogWriteWarnsOnceAndTrainingGoesOn) {
  const auto dir = mantissa_test::toy_output_dir();
  const auto log_file = dir + "/trainer_log.jsonl";
  // Made once training has begun (a fresh run first removes a log left in its folder).
  struct FullDiskAtStart : mantissa::TrainerCallback {
    explicit FullDiskAtStart(std::string path) : path(std::move(path)) {}
    void on_train_begin(const TrainingArguments&, mantissa::TrainerState&,
                        mantissa::TrainerControl&) override {
      ASSERT_EQ(::symlink("/dev/full", path.c_str()), 0);
    }
    std::string path;
  };
  WarningCapture warnings;
  Trainer trainer(make_toy_model(),
                  toy_args(dir).max_steps(12).logging_steps(2).overwrite_output_dir(true),
                  ToyDataset(100));
  trainer.add_callback(std::make_shared<FullDiskAtStart>(log_file));
  trainer.train();
  EXPECT_EQ(trainer.state().global_step, 12);
  EXPECT_GE(trainer.state().log_history.size(), 6u);
  std::size_t log_warnings = 0;
  for (const auto& message : warnings.messages) {
    if (message.find("trainer_log.jsonl") == std::string::npos) continue;
    ++log_warnings;
    EXPECT_THAT(message, HasSubstr("No space left on device"));
  }
  EXPECT_EQ(log_warnings, 1u);
}

TEST(CheckpointTest, InterruptedSavesAreCleanedUpByTheNextSave) {
  const auto run = saved_run();
  const auto& dir = run.dir;
  // A save killed while writing, a rotation killed while deleting, and a re-save of step 4
  // killed between its two renames (checkpoint-4 moved aside, the new one not yet in place).
  mantissa::io::create_directories(dir + "/tmp-checkpoint-3-a1b2c3/partial");
  mantissa::io::create_directories(dir + "/deleting-checkpoint-2-d4e5f6");
  mantissa::io::rename_path(run.checkpoint, dir + "/old-checkpoint-4-g7h8i9");
  EXPECT_TRUE(mantissa::detail::sorted_checkpoints(dir).empty());

  mantissa::detail::clean_interrupted_saves(dir);
  std::vector<std::string> names = mantissa::io::list_directory(dir);
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint-4", "trainer_log.jsonl"}));
  resume(run);  // the restored checkpoint is whole
}

TEST(CheckpointTest, RotationKilledHalfWayLeavesNoHalfDeletedCheckpoint) {
  const auto dir = mantissa_test::toy_output_dir();
  auto args = toy_args(dir).max_steps(4).save_strategy("steps").save_steps(2);
  Trainer(make_toy_model(), args, ToyDataset(100)).train();  // checkpoint-2 and checkpoint-4
  mantissa::detail::FileFaults faults;
  faults.before_remove = [](const std::string& path) {
    throw std::runtime_error("killed while deleting " + path + " (simulated)");
  };
  EXPECT_THROW(mantissa::detail::rotate_checkpoints(dir, 1, std::nullopt, true, faults),
               std::runtime_error);
  // checkpoint-2 was renamed out of the checkpoint names before its deletion began.
  EXPECT_EQ(mantissa::detail::sorted_checkpoints(dir),
            std::vector<std::string>{dir + "/checkpoint-4"});
  std::vector<std::string> deleting;
  for (const auto& name : mantissa::io::list_directory(dir)) {
    if (name.rfind("deleting-", 0) == 0) deleting.push_back(name);
  }
  ASSERT_EQ(deleting.size(), 1u);
  EXPECT_EQ(deleting[0].rfind("deleting-checkpoint-2-", 0), 0u) << deleting[0];

  Trainer(make_toy_model(), args.max_steps(8).save_total_limit(1), ToyDataset(100)).train("latest");
  EXPECT_EQ(mantissa::io::list_directory(dir),
            (std::vector<std::string>{"checkpoint-8", "trainer_log.jsonl"}));
}

TEST(CheckpointTest, FailedSaveLeavesThePreviousCheckpointLoadable) {
  const auto run = saved_run();
  // The save of step 8 fails at optimizer.pt, as on a full disk.
  auto model = make_toy_model();
  Trainer trainer(model, run.args, ToyDataset(100));
  auto state = trainer.state();
  state.global_step = 8;
  mantissa::amp::GradScaler scaler;
  auto parts = parts_of(trainer, *model, state, scaler, run.args);
  std::vector<std::string> written;
  const auto faults = recording_writes(written, "optimizer.pt");
  EXPECT_THROW(mantissa::detail::save_checkpoint(run.dir, parts, faults), std::runtime_error);
  EXPECT_EQ(written, (std::vector<std::string>{"model.safetensors", "optimizer.pt"}));

  std::vector<std::string> entries = mantissa::io::list_directory(run.dir);
  for (const auto& name : entries)
    EXPECT_EQ(name.find("tmp-"), std::string::npos) << "left behind: " << name;
  ASSERT_TRUE(mantissa::io::is_directory(run.checkpoint));
  EXPECT_FALSE(mantissa::io::path_exists(run.dir + "/checkpoint-8"));
  Trainer resumed(make_toy_model(), TrainingArguments(run.args).max_steps(8), ToyDataset(100));
  resumed.train(run.checkpoint);
  EXPECT_EQ(resumed.state().global_step, 8);
}

// A piece of state a run registers (trainer/saved_state.h), as a model converter does: a
// number kept in a text file of its own.
mantissa::detail::SavedState counter_piece(int& value, int* missing_calls = nullptr) {
  mantissa::detail::SavedState piece;
  piece.file = "counter.txt";
  piece.save = [&value](const std::string& path) {
    mantissa::io::write_file_atomically(path, std::to_string(value));
  };
  piece.load = [&value](const std::string& path) {
    const auto bytes = mantissa::io::read_file(path);
    value = std::stoi(std::string(bytes.begin(), bytes.end()));
  };
  if (missing_calls != nullptr) {
    piece.load_missing = [missing_calls](const std::string&) { ++*missing_calls; };
  }
  return piece;
}

TEST(CheckpointTest, ARegisteredPieceIsWrittenAndReadBesideTheOthersInOneOrder) {
  const auto run = saved_run();
  auto model = make_toy_model();
  Trainer trainer(model, run.args, ToyDataset(100));
  auto state = trainer.state();
  state.global_step = 8;
  mantissa::amp::GradScaler scaler(mantissa::amp::GradScalerOptions().enabled(false));
  int saved_value = 42;
  const mantissa::detail::SavedStates pieces{counter_piece(saved_value)};
  auto parts = parts_of(trainer, *model, state, scaler, run.args);
  parts.saved_states = &pieces;
  std::vector<std::string> written;
  const auto faults = recording_writes(written);
  const auto folder = mantissa::detail::save_checkpoint(run.dir, parts, faults);
  EXPECT_EQ(written, (std::vector<std::string>{"model.safetensors", "optimizer.pt", "scheduler.pt",
                                               "scaler.pt", "counter.txt", "trainer_state.json",
                                               "training_args.json", "rng_state.pth"}));

  // Read back into another value; without the file, the piece decides.
  int loaded_value = 0;
  int missing_calls = 0;
  const mantissa::detail::SavedStates readers{counter_piece(loaded_value, &missing_calls)};
  parts.saved_states = &readers;
  mantissa::detail::load_checkpoint(folder, parts);
  EXPECT_EQ(loaded_value, 42);
  EXPECT_EQ(missing_calls, 0);
  ASSERT_EQ(::unlink((folder + "/counter.txt").c_str()), 0);
  mantissa::detail::load_checkpoint(folder, parts);
  EXPECT_EQ(missing_calls, 1);
  // A piece that does not say what a missing file means refuses the checkpoint, naming it.
  const mantissa::detail::SavedStates strict{counter_piece(loaded_value)};
  parts.saved_states = &strict;
  EXPECT_THAT([&] { mantissa::detail::load_checkpoint(folder, parts); },
              ThrowsMessage<c10::Error>(HasSubstr("counter.txt' is missing")));
}

// SGD under another name: a class the checkpoint's table of optimizers lacks.
class UnlistedOptimizer : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
};

TEST(CheckpointTest, AnOptimizerMissingFromTheTableIsRefusedBeforeAnyFileIsWritten) {
  const auto dir = mantissa_test::toy_output_dir();
  auto model = make_toy_model();
  UnlistedOptimizer optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  const auto args = toy_args(dir);
  mantissa::TrainerState state;
  mantissa::amp::GradScaler scaler;
  mantissa::detail::CheckpointParts parts;
  parts.model = model.ptr().get();
  parts.optimizer = &optimizer;
  parts.state = &state;
  parts.args = &args;
  parts.scaler = &scaler;
  mantissa::detail::FileFaults faults;
  faults.before_write = [](const std::string& path) { ADD_FAILURE() << "wrote " << path; };
  EXPECT_THAT([&] { mantissa::detail::save_checkpoint(dir, parts, faults); },
              ThrowsMessage<c10::ValueError>(
                  AllOf(HasSubstr("cannot hold the optimizer"), HasSubstr("UnlistedOptimizer"))));
  EXPECT_TRUE(mantissa::detail::sorted_checkpoints(dir).empty());
  EXPECT_THAT([&] { mantissa::detail::check_optimizer_state(optimizer); },
              ThrowsMessage<c10::ValueError>(HasSubstr("UnlistedOptimizer")));
}

TEST(CheckpointTest, EveryOptimizerOfTheTableHasItsStateChecked) {
  // Each optimizer --optim can name has a state layout (a new entry without one fails here).
  for (const auto& name : mantissa::optim::optimizer_names()) {
    SCOPED_TRACE(name);
    Trainer trainer(make_toy_model(), toy_args(mantissa_test::toy_output_dir()).optim(name),
                    ToyDataset(16));
    EXPECT_NO_THROW(mantissa::detail::optimizer_state_kind(trainer.optimizer()));
  }
  // An RMSprop state of another shape than its parameter's is named with both shapes.
  auto param = torch::zeros({3}, torch::requires_grad());
  torch::optim::RMSprop rmsprop({param}, torch::optim::RMSpropOptions(0.1));
  EXPECT_EQ(c10::demangle(mantissa::detail::optimizer_state_kind(rmsprop).type.name()),
            "torch::optim::RMSprop");
  auto state = std::make_unique<torch::optim::RMSpropParamState>();
  state->square_avg(torch::zeros({4}));
  rmsprop.state()[param.unsafeGetTensorImpl()] = std::move(state);
  EXPECT_THAT([&] { mantissa::detail::check_optimizer_state(rmsprop); },
              ThrowsMessage<c10::ValueError>(
                  AllOf(HasSubstr("the state 'square_avg' of parameter 0 has shape [4]"),
                        HasSubstr("the parameter has shape [3]"))));
}

TEST(CheckpointTest, PrecisionPlanNamesAStaticLossScale) {
  Trainer fixed(make_toy_model(),
                toy_args(mantissa_test::toy_output_dir()).fp16(true).loss_scale(128),
                ToyDataset(8));
  EXPECT_THAT(fixed.precision_plan().describe(), HasSubstr("static loss scale 128"));
  Trainer dynamic(make_toy_model(), toy_args(mantissa_test::toy_output_dir()).fp16(true),
                  ToyDataset(8));
  EXPECT_THAT(dynamic.precision_plan().describe(), HasSubstr("dynamic loss scaling"));
}

}  // namespace

namespace {

TEST(CheckpointTest, TheBestCheckpointNamesItselfInItsOwnState) {
  // The loss falls at every evaluation (lr 1e-2 on the toy problem), so each checkpoint holds
  // the best model so far and its trainer_state.json must name that very checkpoint.
  const auto dir = mantissa_test::toy_output_dir();
  const auto args = toy_args(dir)
                        .max_steps(12)
                        .eval_strategy("steps")
                        .eval_steps(4)
                        .save_strategy("steps")
                        .save_steps(4);
  Trainer(make_toy_model(), args, ToyDataset(100), ToyDataset(64, 3)).train();
  std::optional<double> previous;
  for (const int step : {4, 8, 12}) {
    SCOPED_TRACE(step);
    const auto checkpoint = dir + "/checkpoint-" + std::to_string(step);
    const auto state = nlohmann::json::parse(read_text(checkpoint + "/trainer_state.json"));
    const double best = state.at("best_metric").get<double>();
    if (!previous || best < *previous) {
      EXPECT_EQ(state.at("best_model_checkpoint").get<std::string>(), checkpoint);
    }
    previous = best;
  }
  ASSERT_TRUE(previous.has_value());
}

}  // namespace

namespace {

TEST(CheckpointTest, AFreshRunOverAnotherStartsAFreshLog) {
  // Two runs of 4 steps into one output_dir (the second with overwrite_output_dir): the log
  // holds the second run's steps once, not both runs one after the other.
  const auto dir = mantissa_test::toy_output_dir();
  const auto args = toy_args(dir).max_steps(4).logging_steps(2).overwrite_output_dir(true);
  Trainer(make_toy_model(), args, ToyDataset(100)).train();
  Trainer(make_toy_model(), args, ToyDataset(100)).train();
  std::istringstream lines(read_text(dir + "/trainer_log.jsonl"));
  std::vector<std::int64_t> steps;
  for (std::string line; std::getline(lines, line);) {
    const auto entry = nlohmann::json::parse(line);
    if (!entry.contains("train_runtime")) steps.push_back(entry.at("step").get<std::int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<std::int64_t>{2, 4}));
}

TEST(CheckpointTest, AResumedRunDropsTheLogLinesPastItsCheckpoint) {
  // A run of 8 steps with a checkpoint at 4, resumed there: trainer_log.jsonl keeps the lines
  // up to step 4 once, then the resumed run's, so steps never go back.
  const auto dir = mantissa_test::toy_output_dir();
  const auto args =
      toy_args(dir).max_steps(8).logging_steps(2).save_strategy("steps").save_steps(4);
  Trainer(make_toy_model(), args, ToyDataset(100)).train();
  Trainer(make_toy_model(), args, ToyDataset(100)).train(dir + "/checkpoint-4");
  std::istringstream lines(read_text(dir + "/trainer_log.jsonl"));
  std::vector<std::int64_t> steps;
  for (std::string line; std::getline(lines, line);) {
    const auto entry = nlohmann::json::parse(line);
    ASSERT_TRUE(entry.at("step").is_number_integer()) << line;
    if (!entry.contains("train_runtime")) steps.push_back(entry.at("step").get<std::int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<std::int64_t>{2, 4, 6, 8}));
}

}  // namespace

// ---- the steps of a save shared by several processes --------------------------------------

TEST(CheckpointSharedSaveTest, SavedProcessCountReadsTheRngFiles) {
  namespace io = mantissa::io;
  const auto dir = mantissa_test::toy_output_dir();
  EXPECT_EQ(mantissa::detail::saved_process_count(dir), 0);  // an HF checkpoint without them
  mantissa::detail::write_rng_state(dir, 0, 1);
  EXPECT_TRUE(io::path_exists(io::join_path(dir, "rng_state.pth")));
  EXPECT_EQ(mantissa::detail::saved_process_count(dir), 1);
  const auto ranked = mantissa_test::toy_output_dir();
  for (std::int64_t rank = 0; rank < 3; ++rank) mantissa::detail::write_rng_state(ranked, rank, 3);
  EXPECT_TRUE(io::path_exists(io::join_path(ranked, "rng_state_2.pth")));
  EXPECT_FALSE(io::path_exists(io::join_path(ranked, "rng_state.pth")));
  EXPECT_EQ(mantissa::detail::saved_process_count(ranked), 3);
  // The files record the world size: one deleted does not make it a run of 2.
  io::remove_all(io::join_path(ranked, "rng_state_1.pth"));
  EXPECT_EQ(mantissa::detail::saved_process_count(ranked), 3);
  io::remove_all(io::join_path(ranked, "rng_state_0.pth"));
  EXPECT_EQ(mantissa::detail::saved_process_count(ranked), 3);
}

TEST(CheckpointSharedSaveTest, AFolderLeftByADeadSaveIsCleanedAndAPublishedOneStays) {
  namespace io = mantissa::io;
  const auto out = mantissa_test::toy_output_dir();
  const auto folder = mantissa::detail::begin_checkpoint(out, 7, /*shared_name=*/true);
  EXPECT_EQ(folder, mantissa::detail::shared_checkpoint_folder(out, 7));
  EXPECT_TRUE(io::is_directory(folder));
  // A process that died here leaves the folder; the next save's start removes it.
  mantissa::detail::clean_interrupted_saves(out);
  EXPECT_FALSE(io::path_exists(folder));

  const auto again = mantissa::detail::begin_checkpoint(out, 7, /*shared_name=*/true);
  mantissa::detail::write_rng_state(again, 1, 2);
  const auto final_dir = mantissa::detail::publish_checkpoint(out, again, 7);
  EXPECT_EQ(final_dir, io::join_path(out, "checkpoint-7"));
  EXPECT_TRUE(io::path_exists(io::join_path(final_dir, "rng_state_1.pth")));
  EXPECT_FALSE(io::path_exists(again));
  mantissa::detail::clean_interrupted_saves(out);
  EXPECT_TRUE(io::is_directory(final_dir));
  mantissa::detail::abandon_checkpoint("");  // nothing to remove: no error
}
