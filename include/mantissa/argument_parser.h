#pragma once
// One command line for a training program: HF's TrainingArguments flags and the program's own,
// declared with CLI11, under one `--help`. Header-only over the library; it needs CLI11's
// headers (Debian's libcli11-dev puts them on the default include path; or link CLI11::CLI11),
// which the rest of mantissa does not, so mantissa.h does not include it.

#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <CLI/CLI.hpp>

#include <mantissa/training_arguments.h>

namespace mantissa {
namespace detail {

/// Throws `c10::ValueError` ("--n: invalid value '9223372036854775808' (out of range for a
/// 64-bit integer)") when `text`, the value of the integer flag `flag`, is a number that CLI11
/// 2.1 reads with `strtoll` (`strtoull` when `is_unsigned`) and silently clamps: out of the
/// 64-bit range, or negative for an unsigned flag. Text CLI11 refuses anyway is left to it.
/// Defined in the library, where the messages of TrainingArguments' own flags are made.
void check_integer_flag_range(const std::string& flag, const std::string& text, bool is_unsigned);

}  // namespace detail

/// Reads a program's command line into `TrainingArguments` and the program's own flags.
///
///     mantissa::ArgumentParser parser("Trains my model.");
///     int hidden = 64;
///     parser.app().add_option("--hidden", hidden, "width of the hidden layer");
///     parser.set_defaults({{"eval_strategy", "steps"}, {"eval_steps", "50"}});
///     const auto args = parser.parse(argc, argv);   // --hidden 128 --bf16 --eval_steps 10
///
/// Flags that TrainingArguments knows go to the returned arguments; the others go to the
/// options declared on `app()`, a `CLI::App`. `-h`/`--help` prints one usage with both lists
/// (the program's flags first; the TrainingArguments defaults it shows are the program's
/// `set_defaults`) and exits with status 0. A flag that neither knows, or a bad value of
/// either kind, raises `c10::ValueError` naming it; so does a program's integer flag given a
/// number outside 64 bits, which CLI11 alone would clamp to the largest. Python:
/// `HfArgumentParser((ProgramArguments, TrainingArguments)).parse_args_into_dataclasses()`,
/// with `set_defaults` as argparse's. Touches no device.
class ArgumentParser {
 public:
  /// `description` heads `--help`; `program` names the program in its usage line (default: the
  /// base name it was started under, as argparse's `prog`).
  explicit ArgumentParser(std::string description = "", std::string program = "")
      : app_(std::move(description), std::move(program)) {}

  /// The program's own flags: declare them here with CLI11 (`add_option`, `add_flag`).
  CLI::App& app() { return app_; }

  /// TrainingArguments defaults of this program, as (field, value) pairs in the command line's
  /// spelling: `{{"eval_strategy", "steps"}, {"bf16", "true"}}`. The command line still wins
  /// over them; setting fields on the parsed arguments instead would overwrite what the user
  /// typed. Checked by `parse` (an unknown field is an error there); a command line that is one
  /// `.json` file takes every value from the file instead. Python: argparse's
  /// `parser.set_defaults(eval_strategy="steps")`.
  ArgumentParser& set_defaults(const std::vector<std::pair<std::string, std::string>>& defaults) {
    for (const auto& [field, value] : defaults) {
      defaults_.push_back("--" + field);
      defaults_.push_back(value);
    }
    return *this;
  }

  /// The `--help` text: the program's usage and flags, then every TrainingArguments flag with
  /// the default this program gives it (`set_defaults`, else TrainingArguments').
  std::string help() const {
    return app_.help() + "\n" + TrainingArguments::flags_help_text(defaults_);
  }

  /// Reads `argv` (see the class comment) and returns the validated TrainingArguments; the
  /// program's flags are in the variables bound on `app()`. `-h`/`--help` prints `help()` and
  /// exits with status 0.
  TrainingArguments parse(int argc, const char* const* argv) {
    std::vector<std::string> given;
    for (int i = 1; i < argc; ++i) given.emplace_back(argv[i]);
    return parse(argc > 0 ? std::string(argv[0]) : std::string(), given);
  }

  /// Same as `parse(argc, argv)`, for `main(int argc, char** argv)`.
  TrainingArguments parse(int argc, char** argv) {
    return parse(argc, const_cast<const char* const*>(argv));
  }

  /// Same as `parse(argc, argv)` for a program name and its arguments.
  TrainingArguments parse(const std::string& program, const std::vector<std::string>& given) {
    if (app_.get_name().empty() && !program.empty()) {
      app_.name(program.substr(program.find_last_of('/') + 1));
    }
    for (const auto& arg : given) {
      if (arg == "-h" || arg == "--help") {
        std::cout << help() << std::flush;
        std::exit(0);
      }
    }
    // A lone `.json` argument is a whole training_args.json (HF's scripts): no defaults then.
    const bool json_file = given.size() == 1 && given[0].size() > 5 &&
                           given[0].compare(given[0].size() - 5, 5, ".json") == 0;
    std::vector<std::string> flags = json_file ? std::vector<std::string>{} : defaults_;
    flags.insert(flags.end(), given.begin(), given.end());
    auto [args, rest] = TrainingArguments::parse_known(flags);

    // CLI11 reads the program's flags; whatever it does not know is reported below in
    // argparse's words.
    std::vector<const char*> own{program.empty() ? "program" : program.c_str()};
    for (const auto& arg : rest) own.push_back(arg.c_str());
    app_.allow_extras(true);
    try {
      app_.parse(static_cast<int>(own.size()), own.data());
    } catch (const CLI::ParseError& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
    check_integer_ranges(app_);
    const auto unknown = app_.remaining();
    TORCH_CHECK_VALUE(unknown.empty(), "unrecognized arguments: ", c10::Join(" ", unknown));
    return std::move(args);
  }

 private:
  // The options whose type CLI11 names INT or UINT (those bound to an integer variable), in
  // `app` and the subcommands it parsed.
  static void check_integer_ranges(const CLI::App& app) {
    for (const CLI::Option* option : app.get_options()) {
      const std::string type = option->get_type_name();  // "INT", or "INT:POSITIVE" with a check
      const std::string_view base = std::string_view(type).substr(0, type.find(':'));
      if (base != "INT" && base != "UINT") continue;
      for (const auto& text : option->results()) {
        detail::check_integer_flag_range(option->get_name(), text, base == "UINT");
      }
    }
    for (const CLI::App* subcommand : app.get_subcommands()) check_integer_ranges(*subcommand);
  }

  CLI::App app_;
  std::vector<std::string> defaults_;  // "--field", "value", ...
};

}  // namespace mantissa
