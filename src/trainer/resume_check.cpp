#include "trainer/resume_check.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <mantissa/optim/optimizer_registry.h>

#include "checked_math.h"
#include "io/json_reader.h"

namespace mantissa::detail {
namespace {

template <std::size_t N>
bool among(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// Changing these moves what the saved position points at: the same step count would name other
// batches.
constexpr std::string_view kPositionFields[] = {"dataloader_drop_last"};
// These too, unless the global batch they make with the process count stays the same.
constexpr std::string_view kBatchFields[] = {"per_device_train_batch_size",
                                             "gradient_accumulation_steps"};
// optimizer.pt, scheduler.pt and scaler.pt hold these, so the saved values stay in force.
constexpr std::string_view kRestoredFields[] = {
    "learning_rate", "weight_decay",        "adam_beta1",        "adam_beta2",
    "adam_epsilon",  "initial_scale_power", "loss_scale_window", "low_precision_update"};
// They decide the order of the examples in each epoch.
constexpr std::string_view kDataOrderFields[] = {"seed", "data_seed"};
// Where and how the run executes, not what it computes.
constexpr std::string_view kUnreportedFields[] = {"output_dir",
                                                  "overwrite_output_dir",
                                                  "resume_from_checkpoint",
                                                  "disable_tqdm",
                                                  "use_cpu",
                                                  "dataloader_num_workers",
                                                  "dataloader_pin_memory",
                                                  "cuda_graph",
                                                  "cuda_graph_warmup_steps",
                                                  "per_device_eval_batch_size",
                                                  "report_to",
                                                  "run_name"};

// per_device_train_batch_size x processes x gradient_accumulation_steps, or nullopt when it
// does not fit in int64 (a saved training_args.json is read unvalidated).
std::optional<std::int64_t> global_batch(const TrainingArguments& args, std::int64_t processes) {
  const auto per_step = checked_mul(args.per_device_train_batch_size(), processes);
  return per_step ? checked_mul(*per_step, args.gradient_accumulation_steps()) : std::nullopt;
}

// The optimizer.pt family of the optimizer `args.optim` names; a name no entry has (registered
// by the program that saved, not by this one) is a family of its own.
std::string optimizer_family(const TrainingArguments& args) {
  const auto* spec = optim::find_optimizer(args.optim().name());
  return spec != nullptr ? spec->family
                         : "unregistered optimizer " + std::string(args.optim().name());
}

std::string shown(const std::optional<std::int64_t>& value) {
  return value ? std::to_string(*value) : std::string("beyond int64");
}

}  // namespace

bool is_execution_detail(std::string_view field) { return among(kUnreportedFields, field); }

ResumePosition resume_position(const TrainerState& state, const RunShape& run) {
  TORCH_INTERNAL_ASSERT(run.batches_per_epoch > 0 && run.updates_per_epoch > 0 &&
                        run.gradient_accumulation_steps > 0);
  TORCH_CHECK_VALUE(
      state.train_batch_size == 0 || state.train_batch_size == run.per_device_train_batch_size,
      "the run was saved with 'train_batch_size' ", state.train_batch_size,
      ", but this run has per_device_train_batch_size ", run.per_device_train_batch_size,
      ": the saved step would point at other batches");
  if (state.global_step == 0) return {};
  if (state.steps_in_epoch == 0) {
    // No saved position in the epoch: HF's rule, whole update steps of `accumulation` batches.
    return {state.global_step / run.updates_per_epoch,
            (state.global_step % run.updates_per_epoch) * run.gradient_accumulation_steps};
  }
  TORCH_CHECK_VALUE(
      state.steps_in_epoch <= run.batches_per_epoch, "it was saved after ", state.steps_in_epoch,
      " batches of an epoch ('mantissa.steps_in_epoch'), "
      "but an epoch of this run has ",
      run.batches_per_epoch, " batches. Was the dataset or per_device_train_batch_size changed?");
  const bool epoch_finished = state.steps_in_epoch == run.batches_per_epoch;
  const double epoch = epoch_finished ? std::round(state.epoch) : std::floor(state.epoch);
  const std::int64_t batches_done = epoch_finished ? 0 : state.steps_in_epoch;
  // The epochs before, then the update steps of this one (the last may be a partial group).
  const double expected =
      epoch * static_cast<double>(run.updates_per_epoch) +
      static_cast<double>(ceil_div(batches_done, run.gradient_accumulation_steps));
  TORCH_CHECK_VALUE(expected == static_cast<double>(state.global_step), "'global_step' is ",
                    state.global_step, ", but epoch ", state.epoch, " after ", state.steps_in_epoch,
                    " batches is step ", expected, " in this run (", run.updates_per_epoch,
                    " optimizer steps per epoch of ", run.batches_per_epoch,
                    " batches, gradient_accumulation_steps ", run.gradient_accumulation_steps,
                    "). Was the dataset, per_device_train_batch_size or "
                    "gradient_accumulation_steps changed?");
  return {static_cast<std::int64_t>(epoch), batches_done};
}

ArgumentChanges compare_resumed_arguments(const TrainingArguments& now,
                                          const TrainingArguments& saved, ProcessCounts processes) {
  const auto current = nlohmann::json::parse(now.to_json());
  const auto before = nlohmann::json::parse(saved.to_json());
  const auto global_now = global_batch(now, processes.now);
  const auto global_saved =
      global_batch(saved, processes.saved > 0 ? processes.saved : processes.now);
  const bool same_global_batch = global_now && global_now == global_saved;
  const std::string global_text = fmt::format(
      "the global batch (per_device_train_batch_size x processes x gradient_accumulation_steps) "
      "is {} x {} x {} = {} now and was {} x {} x {} = {}",
      now.per_device_train_batch_size(), processes.now, now.gradient_accumulation_steps(),
      shown(global_now), saved.per_device_train_batch_size(),
      processes.saved > 0 ? processes.saved : processes.now, saved.gradient_accumulation_steps(),
      shown(global_saved));
  ArgumentChanges changes;
  for (const auto& [key, value] : current.items()) {
    const auto it = before.find(key);
    if (it == before.end() || *it == value || is_execution_detail(key)) continue;
    const std::string change = fmt::format("{} is {} now but was {} when the checkpoint was saved",
                                           key, io::describe_json(value), io::describe_json(*it));
    const bool optimizer_family_changes =
        key == "optim" && optimizer_family(now) != optimizer_family(saved);
    if (among(kBatchFields, key)) {
      if (same_global_batch) {
        changes.batch_regrouped = true;
        changes.warnings.push_back(change + "; " + global_text +
                                   ", so the saved step counts the same examples and the run "
                                   "continues from it");
      } else {
        changes.errors.push_back(
            change + " (the saved step would point at other batches: " + global_text + ")");
      }
    } else if (among(kPositionFields, key)) {
      changes.errors.push_back(change + " (the saved step would point at other batches)");
    } else if (optimizer_family_changes) {
      changes.errors.push_back(change + " (optimizer.pt holds the other optimizer's state)");
    } else if (among(kRestoredFields, key)) {
      changes.warnings.push_back(
          change +
          "; the checkpoint's optimizer, scheduler and scaler state keep the saved "
          "value");
    } else if (among(kDataOrderFields, key)) {
      changes.warnings.push_back(
          change +
          "; this run's value is used, so the interrupted epoch continues in another "
          "order (some of its examples are seen twice, others not at all)");
    } else {
      changes.warnings.push_back(change + "; this run's value is used");
    }
  }
  return changes;
}

}  // namespace mantissa::detail
