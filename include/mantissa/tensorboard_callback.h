#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa {

namespace io::detail {
class EventFileWriter;
}

/// Writes the Trainer's logs as TensorBoard event files, for `tensorboard --logdir`. The Trainer
/// adds one when `report_to` is `tensorboard` or `all`; add one by hand with
/// `trainer.add_callback(std::make_shared<TensorBoardCallback>())`.
/// Python: `transformers.integrations.TensorBoardCallback`.
///
/// - The folder: the one given here, else `TENSORBOARD_LOGGING_DIR` (read by the constructor;
///   a leading `~` is the home folder), else `<output_dir>/runs/<run_name>` when `run_name` is
///   set (a mantissa extension: a resumed run with the same name continues the same curves),
///   else HF's `<output_dir>/runs/<Mon DD_HH-MM-SS>_<host>`, chosen once and kept for later
///   `train()` calls of this callback.
/// - `on_train_begin` starts a new event file there and writes the arguments as text (`args`:
///   `training_args.json`); a run resumed at step N first writes a `SessionLog` START at step
///   N + 1, so TensorBoard drops the points an interrupted run wrote after its checkpoint.
/// - `on_log` writes every entry as a scalar at `state.global_step`, tagged as HF's
///   `rewrite_logs` does (`train/loss`, `train/learning_rate`, `eval/loss`, ...), and sends it
///   to the file before returning. `on_train_end` closes the file; a later log (an
///   `evaluate()` after training) opens another one in the same folder.
/// - `LogEntry` holds numbers only, so every value is a scalar: HF's text for string values and
///   its warning for other types have nothing to act on here. Like HF, no hparams are written.
/// - Only the main process writes: nothing happens where the `RANK` environment variable
///   (torchrun's) is set to anything but 0.
/// - A failure to create the folder or write the file never stops training: it is reported
///   once with a warning naming the folder and the reason, and the callback writes nothing more
///   until the next `train()`; trainer_log.jsonl and trainer_state.json still hold every entry.
///
/// Runs on the host; it never touches a device. Not copyable.
class TensorBoardCallback : public TrainerCallback {
 public:
  /// `logging_dir`: the folder of the event files; unset picks one as described above.
  explicit TensorBoardCallback(std::optional<std::string> logging_dir = std::nullopt);
  ~TensorBoardCallback() override;
  TensorBoardCallback(const TensorBoardCallback&) = delete;
  TensorBoardCallback& operator=(const TensorBoardCallback&) = delete;

  /// Starts an event file: the START event of a resumed run, then the arguments as text.
  void on_train_begin(const TrainingArguments& args, TrainerState& state,
                      TrainerControl& control) override;
  /// Writes `logs` as scalars at `state.global_step`.
  void on_log(const TrainingArguments& args, TrainerState& state, TrainerControl& control,
              const LogEntry& logs) override;
  /// Closes the event file.
  void on_train_end(const TrainingArguments& args, TrainerState& state,
                    TrainerControl& control) override;

  /// The folder of the event files, once chosen (by the constructor or the first event).
  const std::optional<std::string>& logging_dir() const noexcept { return logging_dir_; }
  /// The event file being written; empty when none is open.
  std::string event_file() const;

 private:
  /// The open writer, opening one first when there is none; null after a failure.
  io::detail::EventFileWriter* writer(const TrainingArguments& args);
  /// Writes encoded events to the current file; a failure is reported and turns writing off.
  void write(const TrainingArguments& args, const std::vector<std::string>& events);
  void report_failure(const std::exception& error);

  std::optional<std::string> logging_dir_;
  std::unique_ptr<io::detail::EventFileWriter> writer_;
  bool failed_ = false;  // until the next on_train_begin
};

/// Log keys as TensorBoard tags: `eval_<name>` -> `eval/<name>`, `test_<name>` ->
/// `test/<name>`, any other key -> `train/<key>`, in the order of `logs`.
/// Python: `transformers.integrations.rewrite_logs`.
std::vector<std::pair<std::string, double>> rewrite_logs(const LogEntry& logs);

/// `runs/<Mon DD_HH-MM-SS>_<host>` with the local time now (months in English).
/// Python: `transformers.integrations.integration_utils.default_logdir()`, itself the default
/// folder of `torch.utils.tensorboard.SummaryWriter`.
std::string default_logdir();

}  // namespace mantissa
