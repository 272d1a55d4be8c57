// TrainingArguments from the command line: HfArgumentParser's flags, bound with CLI11.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>

#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <mantissa/argument_parser.h>
#include <mantissa/integrations.h>
#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/training_arguments.h>

#include "shorten.h"
#include "training_arguments/gradient_checkpointing_kwargs_json.h"
#include "training_arguments/lr_scheduler_kwargs_json.h"
#include "training_arguments/python_repr.h"

namespace mantissa {
namespace {

// ---------------------------------------------------------------------------------------------
// One flag's text into its field. The same values as HfArgumentParser accepts: string_to_bool
// for bools, int() / float() for numbers, "None" for an unset optional.

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

[[noreturn]] void bad_value(const std::string& flag, const std::string& text,
                            const std::string& why) {
  TORCH_CHECK_VALUE(false, flag, ": invalid value '", detail::shorten(text), "' (", why, ")");
  std::abort();  // unreachable; TORCH_CHECK_VALUE(false, ...) always throws
}

// A leading '+' is allowed (as by Python's int() and float()), a second sign is not.
std::string_view strip_plus(std::string_view s) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-' && s[1] != '+') s.remove_prefix(1);
  return s;
}

void from_cli(const std::string& flag, const std::string& text, bool& out) {
  const std::string v = lower(text);
  // An empty value is the bare flag (`--bf16`): argparse's const=True.
  if (v.empty() || v == "yes" || v == "true" || v == "t" || v == "y" || v == "1") {
    out = true;
  } else if (v == "no" || v == "false" || v == "f" || v == "n" || v == "0") {
    out = false;
  } else {
    bad_value(flag, text,
              "Truthy value expected: got " + detail::shorten(text) +
                  " but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive).");
  }
}

void from_cli(const std::string& flag, const std::string& text, int64_t& out) {
  const std::string_view s = strip_plus(text);
  const auto res = std::from_chars(s.data(), s.data() + s.size(), out);
  if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size()) {
    bad_value(flag, text,
              res.ec == std::errc::result_out_of_range ? "out of range for a 64-bit integer"
                                                       : "expected an integer");
  }
}

void from_cli(const std::string& flag, const std::string& text, double& out) {
  const std::string_view s = strip_plus(text);
  const auto res = std::from_chars(s.data(), s.data() + s.size(), out, std::chars_format::general);
  if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size()) {
    bad_value(flag, text,
              res.ec == std::errc::result_out_of_range ? "out of range for a double"
                                                       : "expected a float");
  }
}

void from_cli(const std::string& /*flag*/, const std::string& text, std::string& out) {
  out = text;
}

// A JSON object (HF's `--lr_scheduler_kwargs '{"num_cycles": 2}'`); validate() checks the keys.
void from_cli(const std::string& flag, const std::string& text, LrSchedulerKwargs& out) {
  out = detail::lr_scheduler_kwargs_from_cli(flag, text);
}

// A JSON object (HF's `--gradient_checkpointing_kwargs '{"use_reentrant": false}'`).
void from_cli(const std::string& flag, const std::string& text, GradientCheckpointingKwargs& out) {
  out = detail::gradient_checkpointing_kwargs_from_cli(flag, text);
}

// Any spelling is kept; validate() names the field when it is not one of the enum's.
template <class E>
void from_cli(const std::string& /*flag*/, const std::string& text, Choice<E>& out) {
  out = Choice<E>(text);
}

// One or more integration names separated by commas, or none / all (ReportTo's meaning).
void from_cli(const std::string& /*flag*/, const std::string& text, ReportTo& out) {
  out = ReportTo(text);
}

// A list flag takes one or more values (`--label_names start_positions end_positions`); CLI11
// hands them over one at a time, and they accumulate.
void from_cli(const std::string& flag, const std::string& text,
              std::optional<std::vector<std::string>>& out) {
  if (text == "None" || text == "none" || text == "null") {
    out.reset();
    return;
  }
  TORCH_CHECK_VALUE(!text.empty(), flag, ": expected a name, got an empty string");
  if (!out) out.emplace();
  out->push_back(text);
}

template <class T>
void from_cli(const std::string& flag, const std::string& text, std::optional<T>& out) {
  if (text == "None" || text == "none" || text == "null") {
    out.reset();
    return;
  }
  T value{};
  from_cli(flag, text, value);
  out = std::move(value);
}

// The metavariable --help shows after a flag: argparse's {a,b,c} for a choice.
template <class T>
struct CliType;
template <>
struct CliType<bool> {
  static std::string name() { return "[BOOL]"; }
};
template <>
struct CliType<int64_t> {
  static std::string name() { return "INT"; }
};
template <>
struct CliType<double> {
  static std::string name() { return "FLOAT"; }
};
template <>
struct CliType<std::string> {
  static std::string name() { return "TEXT"; }
};
template <>
struct CliType<std::vector<std::string>> {
  static std::string name() { return "TEXT [TEXT ...]"; }
};
template <>
struct CliType<LrSchedulerKwargs> {
  static std::string name() { return "JSON"; }
};
template <>
struct CliType<GradientCheckpointingKwargs> : CliType<LrSchedulerKwargs> {};
template <class E>
struct CliType<Choice<E>> {
  static std::string name() {
    std::string text = "{";
    for (std::size_t i = 0; i < Choice<E>::size(); ++i) {
      if (i) text += ",";
      text += Choice<E>::name_at(i);
    }
    return text + "}";
  }
};
// report_to takes comma-separated names of integrations a program may register, and
// ddp_comm_hook's help names each choice with what it does, so both show TEXT.
template <>
struct CliType<ReportTo> : CliType<std::string> {};
template <>
struct CliType<Choice<DdpCommHook>> : CliType<std::string> {};
// optim lists the optimizer registry's names: the built-ins and what the program registered.
template <>
struct CliType<Choice<OptimizerNames>> {
  static std::string name() {
    std::string text = "{";
    for (const auto& optimizer : optim::optimizer_names()) {
      text += (text.size() > 1 ? "," : "") + optimizer;
    }
    return text + "}";
  }
};
template <class T>
struct CliType<std::optional<T>> : CliType<T> {};

template <class T>
constexpr bool is_bool_field = std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>;
template <class T>
constexpr bool is_list_field = std::is_same_v<T, std::optional<std::vector<std::string>>>;

// ---------------------------------------------------------------------------------------------
// The parser: one CLI11 option per flag spelling, each bound to a setter. CLI11 only collects
// the raw strings; they are converted afterwards in command-line order, so that the last
// occurrence wins and the messages are ours.

using Setter =
    std::function<void(TrainingArguments&, const std::string& flag, const std::string& value)>;

struct Binding {
  std::string flag;  // CLI11 gives hidden options no name; messages need the spelling used
  Setter set;
};

struct Cli {
  CLI::App app;
  std::unordered_map<const CLI::Option*, Binding> bindings;
};

std::string dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

CLI::Option* add_value_option(Cli& cli, const std::string& flag, const std::string& description,
                              bool optional_value, bool list_value, const std::string& type_text) {
  CLI::Option* opt = cli.app.add_option(
      flag, CLI::callback_t([](const CLI::results_t&) { return true; }), description);
  if (list_value) {
    opt->expected(1, CLI::detail::expected_max_vector_size);
    opt->allow_extra_args(true);  // CLI11 takes only one value per occurrence otherwise
  } else {
    opt->expected(optional_value ? 0 : 1, 1);
  }
  opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  opt->option_text(type_text);  // CLI11 puts the space in front
  opt->type_name(type_text);    // for CLI11's "--learning_rate: 1 required FLOAT missing"
  return opt;
}

// HfArgumentParser adds `--no_<name>` (store_false) for the bool fields that default to True.
template <class Access>
void add_negative_flag(Cli& cli, const std::string& name, Access access) {
  const Setter unset = [access](TrainingArguments& args, const std::string& flag,
                                const std::string& value) {
    // CLI11 hands a bare flag over as "true"; argparse's store_false takes no value.
    TORCH_CHECK_VALUE(value.empty() || value == "true", flag, ": ignored explicit argument '",
                      detail::shorten(value), "'");
    access(args) = false;
  };
  CLI::Option* no = cli.app.add_flag("--no_" + name);
  no->description("Sets " + name + " to False.");
  no->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cli.bindings.emplace(no, Binding{"--no_" + name, unset});
  CLI::Option* no_alias = cli.app.add_flag("--no-" + dashed(name));
  no_alias->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  no_alias->group("");
  cli.bindings.emplace(no_alias, Binding{"--no-" + dashed(name), unset});
}

// The help of a field as --help shows it: the table's text, and for report_to the integrations
// registered when the help is made (a program's own included).
template <class T>
std::string field_help(const std::string& help, const T& /*value*/) {
  return help;
}
std::string field_help(const std::string& help, const ReportTo& /*value*/) {
  std::string text = help + " Registered:";
  const auto integrations = registered_integrations();
  for (std::size_t i = 0; i < integrations.size(); ++i) {
    const auto& info = integrations[i];
    text += (i ? "; " : " ") + info.name;
    if (!info.description.empty()) text += " (" + info.description + ")";
  }
  return text + ".";
}

// `shown_default` is what --help says (a program's set_defaults); `default_value`, the
// library's, decides the flags themselves (`--no_<name>`), so that --help lists what parses.
template <class T, class Access>
void add_field(Cli& cli, const std::string& name, const std::string& help, const T& default_value,
               const T& shown_default, Access access) {
  // `--fsdp` alone means true (HF's nargs="?", const=True); CLI11 hands it over empty.
  const bool bare_means_true = name == "fsdp";
  const Setter set = [access, bare_means_true](TrainingArguments& args, const std::string& flag,
                                               const std::string& value) {
    from_cli(flag, bare_means_true && value.empty() ? std::string("true") : value, access(args));
  };
  const std::string type_text = CliType<T>::name();
  const std::string description =
      field_help(help, default_value) + " (default: " + detail::help_repr(shown_default) + ")";
  CLI::Option* main = add_value_option(cli, "--" + name, description,
                                       is_bool_field<T> || bare_means_true, is_list_field<T>,
                                       type_text);
  cli.bindings.emplace(main, Binding{"--" + name, set});
  if (name.find('_') != std::string::npos) {
    // HfArgumentParser also takes the dashed spelling; the footer says so once instead of
    // doubling every line of --help.
    const std::string alias_flag = "--" + dashed(name);
    CLI::Option* alias = add_value_option(cli, alias_flag, description, is_bool_field<T>,
                                          is_list_field<T>, type_text);
    alias->group("");
    cli.bindings.emplace(alias, Binding{alias_flag, set});
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (default_value) add_negative_flag(cli, name, access);
  }
}

// Where --help starts each flag's description.
constexpr std::size_t kHelpColumnWidth = 46;

// `shown_defaults`: the values --help gives as each flag's default.
std::unique_ptr<Cli> make_cli(const std::string& program_name,
                              const TrainingArguments& shown_defaults = TrainingArguments()) {
  auto cli = std::make_unique<Cli>();
  CLI::App& app = cli->app;
  app.name(program_name);
  app.description("mantissa TrainingArguments: the flags of Hugging Face's TrainingArguments.");
  app.footer(
      "Every flag also takes dashes for underscores (--learning-rate). Bool flags take an "
      "optional value: --bf16, --bf16 true, --bf16=false (yes/no, true/false, t/f, y/n, 1/0). "
      "Optional fields take None to unset them. A single argument ending in .json reads "
      "that file instead.");
  app.allow_extras();
  app.get_formatter()->column_width(kHelpColumnWidth);
  const TrainingArguments defaults;
#define MANTISSA_TA_ADD_FLAG_(type, name, default_value, help)               \
  add_field<type>(*cli, #name, help, defaults.name(), shown_defaults.name(), \
                  [](TrainingArguments& args) -> type& { return args.name(); });
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_ADD_FLAG_)
#undef MANTISSA_TA_ADD_FLAG_
  return cli;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string base_name(const char* argv0) {
  if (argv0 == nullptr || *argv0 == '\0') return "train";
  const std::string s(argv0);
  const auto slash = s.find_last_of('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

// Parses without validating; the callers validate.
std::pair<TrainingArguments, std::vector<std::string>> parse_unvalidated(int argc,
                                                                         const char* const* argv) {
  TORCH_CHECK_VALUE(argc >= 0 && (argc == 0 || argv != nullptr), "parse: bad argc/argv");
  if (argc == 2 && ends_with(argv[1], ".json")) {
    return {TrainingArguments::load_json(argv[1]), {}};  // its messages name the file
  }
  auto cli = make_cli(base_name(argc > 0 ? argv[0] : nullptr));
  const char* const empty_argv[] = {"train"};
  try {
    if (argc == 0) {
      cli->app.parse(1, empty_argv);
    } else {
      cli->app.parse(argc, argv);
    }
  } catch (const CLI::CallForHelp&) {
    std::cout << cli->app.help() << std::flush;
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  TrainingArguments args;
  std::unordered_map<const CLI::Option*, std::size_t> next;
  for (const CLI::Option* opt : cli->app.parse_order()) {
    const auto it = cli->bindings.find(opt);
    if (it == cli->bindings.end()) continue;  // --help
    const auto& results = opt->results();
    std::size_t& i = next[opt];
    const std::string value =
        results.empty() ? std::string() : results[std::min(i, results.size() - 1)];
    ++i;
    it->second.set(args, it->second.flag, value);
  }
  return {std::move(args), cli->app.remaining()};
}

std::vector<const char*> make_argv(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"train"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return argv;
}

}  // namespace

void detail::check_integer_flag_range(const std::string& flag, const std::string& text,
                                      bool is_unsigned) {
  // The calls CLI11 2.1's integral_conversion makes (base 0: "0x10" and "010" are numbers too).
  char* end = nullptr;
  errno = 0;
  if (is_unsigned) {
    const unsigned long long value = std::strtoull(text.c_str(), &end, 0);
    const auto sign = text.find_first_not_of(" \t\n\v\f\r");
    const bool negative = sign != std::string::npos && text[sign] == '-' && value != 0;
    if (end == text.c_str() + text.size() && (errno == ERANGE || negative)) {
      bad_value(flag, text, "out of range for an unsigned 64-bit integer");
    }
  } else {
    static_cast<void>(std::strtoll(text.c_str(), &end, 0));
    if (end == text.c_str() + text.size() && errno == ERANGE) {
      bad_value(flag, text, "out of range for a 64-bit integer");
    }
  }
}

TrainingArguments TrainingArguments::parse(int argc, const char* const* argv) {
  auto [args, remaining] = parse_unvalidated(argc, argv);
  if (!remaining.empty()) {
    std::string joined;
    for (const auto& r : remaining) joined += (joined.empty() ? "" : " ") + detail::shorten(r);
    TORCH_CHECK_VALUE(false, "unrecognized arguments: ", joined);
  }
  args.validate();
  return args;
}

TrainingArguments TrainingArguments::parse(int argc, char** argv) {
  return parse(argc, const_cast<const char* const*>(argv));
}

TrainingArguments TrainingArguments::parse(const std::vector<std::string>& args) {
  const auto argv = make_argv(args);
  return parse(static_cast<int>(argv.size()), argv.data());
}

std::pair<TrainingArguments, std::vector<std::string>> TrainingArguments::parse_known(
    int argc, const char* const* argv) {
  auto result = parse_unvalidated(argc, argv);
  result.first.validate();
  return result;
}

std::pair<TrainingArguments, std::vector<std::string>> TrainingArguments::parse_known(int argc,
                                                                                      char** argv) {
  return parse_known(argc, const_cast<const char* const*>(argv));
}

std::pair<TrainingArguments, std::vector<std::string>> TrainingArguments::parse_known(
    const std::vector<std::string>& args) {
  const auto argv = make_argv(args);
  return parse_known(static_cast<int>(argv.size()), argv.data());
}

std::string TrainingArguments::help_text(const std::string& program_name) {
  return make_cli(program_name)->app.help();
}

std::string TrainingArguments::flags_help_text(const std::vector<std::string>& default_flags) {
  // Unvalidated: --help works whatever the machine, and the defaults need not make a run alone.
  const auto argv = make_argv(default_flags);
  auto cli = make_cli("train", parse_unvalidated(static_cast<int>(argv.size()), argv.data()).first);
  cli->app.set_help_flag();  // the program's own help lists -h
  CLI::Formatter formatter;  // the layout of help_text's
  formatter.column_width(kHelpColumnWidth);
  std::string groups = formatter.make_groups(&cli->app, CLI::AppFormatMode::Normal);
  groups.erase(0, groups.find_first_not_of('\n'));
  const std::string heading = "Options:";
  if (groups.compare(0, heading.size(), heading) == 0) {
    groups.replace(0, heading.size(), "TrainingArguments options:");
  }
  return groups + "\n" + cli->app.get_footer() + "\n";
}

}  // namespace mantissa
