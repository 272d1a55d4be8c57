#pragma once
// trainer_log.jsonl: one JSON object per log or evaluation entry, appended as it happens, so
// that a run can be plotted (scripts/plot_metrics) while it trains. A callback: the Trainer
// adds it first, ahead of report_to's integrations and the user's callbacks, on the processes
// that save (whatever report_to says), so the line is on disk before any of them sees the log.

#include <cstdint>
#include <string>

#include <mantissa/trainer_callback.h>

namespace mantissa::detail {

/// Appends log entries to `<output_dir>/trainer_log.jsonl`. A write that fails (a full disk, a
/// read-only folder) is reported once with a warning that names the file and the reason, and
/// training goes on: the same entries are kept in `TrainerState::log_history`, which each
/// checkpoint saves. Python: none (HF keeps the entries in trainer_state.json alone).
class MetricsLog : public TrainerCallback {
 public:
  explicit MetricsLog(std::string output_dir);

  /// Appends `logs` with "step" set to `state.global_step`: the entry `log_history` holds.
  void on_log(const TrainingArguments& args, TrainerState& state, TrainerControl& control,
              const LogEntry& logs) override;

  /// Writes `entry` as one line (whole numbers as integers, non-finite values as
  /// "NaN"/"Infinity"/"-Infinity", as in trainer_state.json's log_history). Creates
  /// the output folder when it is missing. Never throws for an I/O failure.
  void append(const LogEntry& entry);

  /// Removes the entries logged after `global_step` (a resumed run logs them again), keeping
  /// every other line as it is; rewrites the file atomically, and only when something goes.
  /// A missing file is left missing. Never throws for an I/O failure (warned once, as
  /// `append`).
  void drop_after(std::int64_t global_step);

  /// A fresh run's start: removes the trainer_log.jsonl an earlier run left in the folder (one
  /// trained over with overwrite_output_dir), unless this log wrote to it already (an
  /// evaluate() before train()), so that the file holds one run. Never throws for an I/O
  /// failure (warned once, as `append`).
  void start_fresh();

  /// Whether anything was written (the Trainer then owns the output folder's content).
  bool wrote() const { return wrote_; }

 private:
  std::string output_dir_;
  std::string path_;  // output_dir_/trainer_log.jsonl
  bool wrote_ = false;
  void report_failure(const std::string& failure);

  bool failure_reported_ = false;
};

}  // namespace mantissa::detail
