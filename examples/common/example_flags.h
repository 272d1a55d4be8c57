#pragma once
// The command line of an example trainer: Hugging Face's TrainingArguments flags plus the
// program's own flags, declared with CLI11.

#include <CLI/CLI.hpp>

#include <mantissa/training_arguments.h>

namespace mantissa::examples {

/// Reads `argv`: the TrainingArguments flags (`--bf16`, `--learning_rate 3e-4`, ...) go to the
/// returned arguments, the rest to the options declared on `app` (the program's own flags).
/// `-h`/`--help` prints both lists and exits with status 0. An argument that neither knows
/// raises `c10::ValueError` ("unrecognized arguments: --foo"), as does a bad value of either
/// kind, naming the flag and the value.
///
/// Python: `HfArgumentParser((ProgramArguments, TrainingArguments)).parse_args_into_dataclasses()`.
TrainingArguments parse_example_flags(CLI::App& app, int argc, char** argv);

}  // namespace mantissa::examples
