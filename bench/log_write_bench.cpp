// What one log entry costs to write: a TensorBoard event (TensorBoardCallback::on_log) beside a
// trainer_log.jsonl line (the Trainer's MetricsLog), measured side by side in one run into the
// same folder. Prints microseconds per log and their ratio.
//
//   log_write_bench [logs per round = 20000] [folder = $TMPDIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <mantissa/tensorboard_callback.h>
#include "io/filesystem.h"

#include "trainer/metrics_log.h"

namespace {

using Clock = std::chrono::steady_clock;

double micros_per(Clock::time_point start, int count) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / count;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 20000;
  const std::string parent = argc > 2 ? argv[2] : "";
  const auto dir = mantissa::io::make_temp_directory(parent, "mantissa-log-bench-");
  // A training log line with fp16's keys.
  const mantissa::LogEntry logs{
      {"loss", 1.23},        {"learning_rate", 1e-4},        {"grad_norm", 0.7},
      {"epoch", 0.5},        {"samples_per_second", 1234.5}, {"loss_scale", 65536.0},
      {"skipped_steps", 0.0}};
  mantissa::TrainingArguments args;
  mantissa::TrainerState state;
  mantissa::TrainerControl control;
  mantissa::TensorBoardCallback tensorboard(mantissa::io::join_path(dir, "tb"));
  mantissa::detail::MetricsLog jsonl(dir);
  tensorboard.on_train_begin(args, state, control);

  double event_us = 0, line_us = 0;
  for (int round = 0; round < 3; ++round) {  // alternate, so both see the same disk state
    auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      state.global_step = round * n + i;
      tensorboard.on_log(args, state, control, logs);
    }
    event_us = micros_per(start, n);
    start = Clock::now();
    for (int i = 0; i < n; ++i) jsonl.append(logs);
    line_us = micros_per(start, n);
  }
  tensorboard.on_train_end(args, state, control);
  std::printf(
      "log of %zu scalars, %d per round, last of 3 rounds: TensorBoard event %.2f us, "
      "trainer_log.jsonl line %.2f us (event / line = %.2f)\n",
      logs.size(), n, event_us, line_us, event_us / line_us);
  mantissa::io::remove_all(dir);
  return 0;
}
