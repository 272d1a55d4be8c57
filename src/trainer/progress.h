#pragma once
// The Trainer's console output: a progress bar with rate and ETA when stdout is a terminal,
// plain lines otherwise (CI, pipes, files), and HF-style log dictionaries.

#include <chrono>
#include <cstdint>
#include <string>

#include <mantissa/trainer_callback.h>

namespace mantissa::detail {

/// Formats a log entry the way HF's Trainer prints it: {'loss': 0.6931, 'learning_rate': 5e-05,
/// ...}.
std::string format_log(const LogEntry& logs);

class Progress {
 public:
  /// `enabled`: draw the bar (stdout is a terminal, disable_tqdm off, not under CI).
  /// `prints` false silences `print` too: the processes of a data-parallel run that do not log.
  Progress(std::int64_t total_steps, bool enabled, bool prints = true);
  /// Whether the bar should be drawn for these arguments on this terminal.
  static bool wanted(bool disable_tqdm);

  /// Moves the bar to `step` (redrawn at most ten times a second).
  void update(std::int64_t step);
  /// Prints a line above the bar (or alone when there is no bar).
  void print(const std::string& line);
  /// Ends the bar's line.
  void close();

 private:
  void draw(std::int64_t step);
  std::int64_t total_;
  std::int64_t first_step_ = -1;
  bool enabled_;
  bool prints_;
  bool drawn_ = false;
  std::int64_t last_step_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace mantissa::detail
