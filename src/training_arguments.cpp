#include <mantissa/training_arguments.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#if defined(MANTISSA_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "checked_math.h"
#include "device_info.h"
#include "io/atomic_file.h"
#include "io/json_reader.h"
#include "trainer/reporting.h"

namespace mantissa {
namespace {

// Key order follows the declaration order, as HF's `json.dumps(asdict(args))` does.
using Json = nlohmann::ordered_json;

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// ---------------------------------------------------------------------------------------------
// The allowed values of the string fields that are enums in HF. Python's enum order, so the
// error text lists them as HF does.

struct Choices {
  const char* field;
  const char* enum_name;  // HF's enum class name, for its error wording
  std::vector<std::string> values;
};

const std::vector<Choices>& all_choices() {
  static const std::vector<Choices> choices{
      {"optim", "OptimizerNames", {"adamw_torch", "adamw_torch_fused", "adamw_mantissa_fused", "sgd"}},
      {"lr_scheduler_type", "SchedulerType", {"linear", "cosine", "constant", "constant_with_warmup"}},
      {"eval_strategy", "IntervalStrategy", {"no", "steps", "epoch"}},
      {"logging_strategy", "IntervalStrategy", {"no", "steps", "epoch"}},
      {"save_strategy", "SaveStrategy", {"no", "steps", "epoch", "best"}},
      {"master_weights", "MasterWeightsMode", {"auto", "on", "off"}},
  };
  return choices;
}

const Choices* choices_for(std::string_view field) {
  for (const auto& c : all_choices()) {
    if (field == c.field) return &c;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Values as Python prints them (`repr`), so messages and --help read like HF's.

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest digits that read back exactly, then Python's layout: positional notation for
  // exponents in [-4, 16), scientific with a two-digit exponent otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  const bool negative = s.front() == '-';
  if (negative) s.erase(0, 1);
  const auto e_pos = s.find('e');
  const int exponent = std::atoi(s.c_str() + e_pos + 1);
  std::string digits;
  for (char c : s.substr(0, e_pos)) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      const auto int_len = static_cast<std::size_t>(exponent) + 1;
      std::string int_part = digits.substr(0, std::min(digits.size(), int_len));
      int_part.resize(int_len, '0');
      const std::string frac = digits.size() > int_len ? digits.substr(int_len) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  }
  return negative ? "-" + out : out;
}

std::string repr(bool v) { return v ? "True" : "False"; }
std::string repr(int64_t v) { return std::to_string(v); }
std::string repr(double v) { return py_float(v); }
std::string repr(const std::string& v) { return "'" + v + "'"; }
template <class T>
std::string repr(const std::optional<T>& v) {
  return v ? repr(*v) : "None";
}

// argparse's "(default: %(default)s)" prints strings without quotes.
template <class T>
std::string help_repr(const T& v) {
  return repr(v);
}
std::string help_repr(const std::string& v) { return v; }
std::string help_repr(const std::optional<std::string>& v) { return v ? *v : "None"; }

// "['a', 'b']", Python's list repr.
std::string py_list(const std::vector<std::string>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += repr(values[i]);
  }
  return out + "]";
}

// "'a', 'b'" for from_json's message: the first few keys, each cut short, so that a hostile
// file of a million long keys gives a message of one line.
std::string unknown_keys_text(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 5;
  constexpr std::size_t kKeyChars = 60;
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < kShown; ++i) {
    if (i) out += ", ";
    out += keys[i].size() > kKeyChars ? repr(keys[i].substr(0, kKeyChars) + "...") : repr(keys[i]);
  }
  if (keys.size() > kShown) out += " and " + std::to_string(keys.size() - kShown) + " more";
  return out;
}

// ---------------------------------------------------------------------------------------------
// Command-line values. Same acceptance as HfArgumentParser: string_to_bool for bools,
// int()/float() for numbers, "None" for an unset optional.

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

[[noreturn]] void bad_value(const std::string& flag, const std::string& text,
                            const std::string& why) {
  TORCH_CHECK_VALUE(false, flag, ": invalid value '", text, "' (", why, ")");
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
              "Truthy value expected: got " + text +
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

template <class T>
struct CliType;
template <>
struct CliType<bool> {
  static constexpr const char* name = "[BOOL]";
};
template <>
struct CliType<int64_t> {
  static constexpr const char* name = "INT";
};
template <>
struct CliType<double> {
  static constexpr const char* name = "FLOAT";
};
template <>
struct CliType<std::string> {
  static constexpr const char* name = "TEXT";
};
template <class T>
struct CliType<std::optional<T>> : CliType<T> {};

template <class T>
constexpr bool is_bool_field = std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>;

// ---------------------------------------------------------------------------------------------
// JSON values.

template <class T>
Json to_json_value(const char* key, const T& v) {
  if constexpr (std::is_same_v<T, double>) {
    // JSON has no inf or nan; nlohmann would write null and the file would not read back.
    TORCH_CHECK_VALUE(std::isfinite(v), "to_json: ", key, " is ", repr(v),
                      ", which JSON cannot hold");
  }
  return Json(v);
}

template <class T>
Json to_json_value(const char* key, const std::optional<T>& v) {
  return v ? to_json_value(key, *v) : Json(nullptr);
}

void from_json_value(const char* key, const Json& j, bool& out) {
  TORCH_CHECK_VALUE(j.is_boolean(), key, ": expected true or false, got ", io::describe_json(j));
  out = j.get<bool>();
}

void from_json_value(const char* key, const Json& j, int64_t& out) {
  TORCH_CHECK_VALUE(j.is_number_integer(), key, ": expected an integer, got ", io::describe_json(j));
  if (j.is_number_unsigned()) {
    TORCH_CHECK_VALUE(j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                      key, ": ", io::describe_json(j), " is out of range for a 64-bit integer");
  }
  out = j.get<int64_t>();
}

void from_json_value(const char* key, const Json& j, double& out) {
  TORCH_CHECK_VALUE(j.is_number(), key, ": expected a number, got ", io::describe_json(j));
  out = j.get<double>();
}

void from_json_value(const char* key, const Json& j, std::string& out) {
  TORCH_CHECK_VALUE(j.is_string(), key, ": expected a string, got ", io::describe_json(j));
  out = j.get<std::string>();
}

template <class T>
void from_json_value(const char* key, const Json& j, std::optional<T>& out) {
  if (j.is_null()) {
    out.reset();
    return;
  }
  T value{};
  from_json_value(key, j, value);
  out = std::move(value);
}

template <class T>
void check_finite(const char* field, const T& v) {
  if constexpr (std::is_same_v<T, double>) {
    TORCH_CHECK_VALUE(std::isfinite(v), field, " must be a finite number, got ", repr(v));
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    TORCH_CHECK_VALUE(!v || std::isfinite(*v), field, " must be a finite number or None, got ",
                      repr(v));
  }
}

// ---------------------------------------------------------------------------------------------
// The command-line parser: one CLI11 option per flag spelling, each bound to a setter. CLI11
// only collects the raw strings; we convert them afterwards in command-line order, so the
// last occurrence wins and the messages are ours.

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
                              bool optional_value, const std::string& type_text) {
  CLI::Option* opt = cli.app.add_option(
      flag, CLI::callback_t([](const CLI::results_t&) { return true; }), description);
  opt->expected(optional_value ? 0 : 1, 1);
  opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  opt->option_text(type_text);  // CLI11 puts the space in front
  opt->type_name(type_text);    // for CLI11's "--learning_rate: 1 required FLOAT missing"
  return opt;
}

template <class T, class Access>
void add_field(Cli& cli, const std::string& name, const std::string& help, const T& default_value,
               Access access) {
  const Setter set = [access](TrainingArguments& args, const std::string& flag,
                              const std::string& value) { from_cli(flag, value, access(args)); };
  std::string type_text = CliType<T>::name;
  if (const Choices* c = choices_for(name)) {
    type_text = "{";
    for (std::size_t i = 0; i < c->values.size(); ++i) type_text += (i ? "," : "") + c->values[i];
    type_text += "}";
  }
  const std::string description = help + " (default: " + help_repr(default_value) + ")";
  CLI::Option* main = add_value_option(cli, "--" + name, description, is_bool_field<T>, type_text);
  cli.bindings.emplace(main, Binding{"--" + name, set});
  if (name.find('_') != std::string::npos) {
    // HfArgumentParser also accepts the dashed spelling; listed once in the footer instead of
    // doubling every line of --help.
    const std::string alias_flag = "--" + dashed(name);
    CLI::Option* alias =
        add_value_option(cli, alias_flag, description, is_bool_field<T>, type_text);
    alias->group("");
    cli.bindings.emplace(alias, Binding{alias_flag, set});
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (default_value) {
      // HfArgumentParser adds `--no_<name>` (store_false) for bool fields that default to True.
      const Setter unset = [access](TrainingArguments& args, const std::string& flag,
                                    const std::string& value) {
        // CLI11 hands a bare flag over as "true"; argparse's store_false takes no value.
        TORCH_CHECK_VALUE(value.empty() || value == "true", flag, ": ignored explicit argument '",
                          value, "'");
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
  }
}

std::unique_ptr<Cli> make_cli(const std::string& program_name) {
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
  app.get_formatter()->column_width(46);
  const TrainingArguments defaults;
#define MANTISSA_TA_ADD_FLAG_(type, name, default_value, help)                    \
  add_field<type>(*cli, #name, help, defaults.name(),                             \
                  [](TrainingArguments& args) -> type& { return args.name(); });
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_ADD_FLAG_)
#undef MANTISSA_TA_ADD_FLAG_
  return cli;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string base_name(const char* argv0) {
  if (argv0 == nullptr || *argv0 == '\0') return "train";
  const std::string s(argv0);
  const auto slash = s.find_last_of('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

// Parses without validating; the callers validate.
std::pair<TrainingArguments, std::vector<std::string>> parse_impl(int argc,
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
    const std::string value = results.empty() ? std::string() : results[std::min(i, results.size() - 1)];
    ++i;
    it->second.set(args, it->second.flag, value);
  }
  return {std::move(args), cli->app.remaining()};
}

}  // namespace

// =============================================================================================
// Device queries and the hardware decision.

namespace detail {

int cuda_compute_capability_major() { return query_device_info().cuda_capability_major; }

const DeviceInfo& query_device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    d.cuda_available = torch::cuda::is_available();
#if defined(MANTISSA_WITH_CUDA)
    if (d.cuda_available) {
      int major = -1;
      int minor = -1;
      if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
          cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess) {
        d.cuda_capability_major = major;
        d.cuda_capability_minor = minor;
      } else {
        (void)cudaGetLastError();  // leave no sticky error behind for the next CUDA call
      }
    }
#endif
    // Older LibTorch builds have no Half matmul on the CPU ("addmm_impl_cpu_" not implemented
    // for 'Half'); 2.x has them. Ask the library itself rather than its version number.
    try {
      const auto a = at::ones({2, 2}, at::TensorOptions().dtype(at::kHalf));
      d.cpu_fp16 = at::mm(a, a).defined();
    } catch (const c10::Error&) {
      d.cpu_fp16 = false;
    }
    return d;
  }();
  return info;
}

void check_precision_support(const TrainingArguments& args, const DeviceInfo& info) {
  const bool on_cuda = info.cuda_available && !args.use_cpu();
  const bool capability_known = info.cuda_capability_major >= 0;
  const std::string capability =
      std::to_string(info.cuda_capability_major) + "." + std::to_string(info.cuda_capability_minor);

  if (args.bf16() || args.bf16_full_eval()) {
    const char* field = args.bf16() ? "bf16" : "bf16_full_eval";
    // bf16 autocast runs on any CPU; on CUDA it needs Ampere (sm_80) tensor cores. An unknown
    // capability (library built without the CUDA runtime) is let through.
    TORCH_CHECK_VALUE(!on_cuda || !capability_known || info.cuda_capability_major >= 8,
                      "Your setup doesn't support bf16/gpu. You need Ampere+ GPU with cuda>=11.0. (",
                      field, "=True, but cuda:0 has compute capability ", capability,
                      "; use --fp16 there, or --use_cpu to train on the CPU)");
  }
  if (args.fp16() || args.fp16_full_eval()) {
    const char* field = args.fp16() ? "fp16" : "fp16_full_eval";
    TORCH_CHECK_VALUE(on_cuda || info.cpu_fp16,
                      "FP16 Mixed precision training with AMP or APEX (`--fp16`) and FP16 half "
                      "precision evaluation (`--fp16_full_eval`) can only be used on CUDA "
                      "devices. (",
                      field, "=True on the CPU, and this LibTorch has no float16 CPU kernels; "
                      "use --bf16 on the CPU)");
  }
  if (args.tf32().value_or(false)) {
    std::string why;
    if (!info.cuda_available) {
      why = "no CUDA device is visible";
    } else if (args.use_cpu()) {
      why = "use_cpu=True trains on the CPU";
    } else if (capability_known && info.cuda_capability_major < 8) {
      why = "cuda:0 has compute capability " + capability;
    }
    TORCH_CHECK_VALUE(why.empty(),
                      "--tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7 "
                      "(tf32=True, but ",
                      why, "; use --tf32 false or leave it unset)");
  }
}

}  // namespace detail

// =============================================================================================
// Validation

namespace {

// The run's counts (examples per optimizer step, optimizer steps, epochs, examples drawn) are
// int64 in the Trainer and its state. Those that follow from the arguments alone are checked
// here, so that an impossible size is an error naming its flag rather than a wrapped count;
// make_run_schedule (src/trainer/schedule.cpp) checks those that depend on the dataset.
void check_counts_fit(const TrainingArguments& args) {
  const auto batch = args.per_device_train_batch_size();
  const auto accumulation = args.gradient_accumulation_steps();
  const auto examples_per_step = detail::checked_mul(batch, accumulation);
  TORCH_CHECK_VALUE(examples_per_step.has_value(), "--per_device_train_batch_size ", batch,
                    " x --gradient_accumulation_steps ", accumulation,
                    " examples per optimizer step is more than a 64-bit count holds (at most ",
                    detail::kMaxCount, ")");
  if (args.max_steps() > 0) {
    TORCH_CHECK_VALUE(detail::checked_mul(args.max_steps(), *examples_per_step).has_value(),
                      "--max_steps ", args.max_steps(), " optimizer steps of ", *examples_per_step,
                      " examples each (--per_device_train_batch_size ", batch,
                      " x --gradient_accumulation_steps ", accumulation,
                      ") is more examples than a 64-bit count holds (at most ", detail::kMaxCount,
                      "); lower --max_steps");
    return;
  }
  const double epochs = args.num_train_epochs();
  TORCH_CHECK_VALUE(detail::fits_int64(std::ceil(epochs)), "--num_train_epochs ", repr(epochs),
                    " is more epochs than a 64-bit count holds (at most ", detail::kMaxCount, ")");
  // Every epoch takes at least one optimizer step, whatever the dataset.
  const auto min_steps = static_cast<int64_t>(std::ceil(epochs));
  TORCH_CHECK_VALUE(
      detail::checked_mul(min_steps, *examples_per_step).has_value(), "--num_train_epochs ",
      repr(epochs), " (at least ", min_steps, " optimizer steps) of ", *examples_per_step,
      " examples per step (--per_device_train_batch_size ", batch,
      " x --gradient_accumulation_steps ", accumulation,
      ") is more examples than a 64-bit count holds (at most ", detail::kMaxCount, ")");
}

// An interval in steps (or a ratio below 1 of the run): what `resolve_steps` can turn into a
// step count.
void check_step_count(const char* field, double steps) {
  TORCH_CHECK_VALUE(steps >= 0 && steps < 0x1p63, "--", field, " ", repr(steps),
                    " is not a number of steps: it must lie in [0, ", detail::kMaxCount, "]");
}

}  // namespace

void TrainingArguments::validate() const {
  // JSON cannot hold inf or nan, and no field means anything with them.
#define MANTISSA_TA_CHECK_FINITE_(type, name, default_value, help) check_finite(#name, name##_);
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_CHECK_FINITE_)
#undef MANTISSA_TA_CHECK_FINITE_

  // Enum-valued strings, in HF's ExplicitEnum wording.
  const auto check_choice = [](const char* field, const std::string& value) {
    const Choices* c = choices_for(field);
    TORCH_INTERNAL_ASSERT(c != nullptr, "no choices for ", field);
    TORCH_CHECK_VALUE(std::find(c->values.begin(), c->values.end(), value) != c->values.end(),
                      field, ": ", value, " is not a valid ", c->enum_name,
                      ", please select one of ", py_list(c->values));
  };
  check_choice("optim", optim_);
  check_choice("lr_scheduler_type", lr_scheduler_type_);
  check_choice("eval_strategy", eval_strategy_);
  check_choice("logging_strategy", logging_strategy_);
  check_choice("save_strategy", save_strategy_);
  check_choice("master_weights", master_weights_);
  detail::parse_report_to(report_to_);  // report_to and run_name: trainer/reporting.h
  detail::check_run_name(run_name_);

  // Precision combinations (HF's texts).
  TORCH_CHECK_VALUE(!(fp16_ && bf16_),
                    "At most one of fp16 and bf16 can be True, but not both (fp16=True, bf16=True)");
  TORCH_CHECK_VALUE(!(fp16_full_eval_ && bf16_full_eval_),
                    "At most one of fp16 and bf16 can be True for full eval, but not both "
                    "(fp16_full_eval=True, bf16_full_eval=True)");

  TORCH_CHECK_VALUE(!output_dir_.empty(), "output_dir must not be empty, got ''");

  // Length and batch.
  TORCH_CHECK_VALUE(max_steps_ > 0 || num_train_epochs_ > 0,
                    "num_train_epochs must be positive when max_steps <= 0, got num_train_epochs=",
                    repr(num_train_epochs_), " and max_steps=", max_steps_);
  TORCH_CHECK_VALUE(per_device_train_batch_size_ > 0,
                    "per_device_train_batch_size must be positive, got ",
                    per_device_train_batch_size_);
  TORCH_CHECK_VALUE(per_device_eval_batch_size_ > 0,
                    "per_device_eval_batch_size must be positive, got ",
                    per_device_eval_batch_size_);
  TORCH_CHECK_VALUE(gradient_accumulation_steps_ >= 1,
                    "gradient_accumulation_steps must be at least 1, got ",
                    gradient_accumulation_steps_);
  check_counts_fit(*this);

  // Optimizer (torch.optim's limits).
  TORCH_CHECK_VALUE(learning_rate_ >= 0, "learning_rate must be non-negative, got ",
                    repr(learning_rate_));
  TORCH_CHECK_VALUE(weight_decay_ >= 0, "weight_decay must be non-negative, got ",
                    repr(weight_decay_));
  TORCH_CHECK_VALUE(adam_beta1_ >= 0 && adam_beta1_ < 1, "adam_beta1 must be in [0, 1), got ",
                    repr(adam_beta1_));
  TORCH_CHECK_VALUE(adam_beta2_ >= 0 && adam_beta2_ < 1, "adam_beta2 must be in [0, 1), got ",
                    repr(adam_beta2_));
  TORCH_CHECK_VALUE(adam_epsilon_ >= 0, "adam_epsilon must be non-negative, got ",
                    repr(adam_epsilon_));
  TORCH_CHECK_VALUE(max_grad_norm_ >= 0,
                    "max_grad_norm must be non-negative (0 disables clipping), got ",
                    repr(max_grad_norm_));

  // Schedule.
  TORCH_CHECK_VALUE(warmup_steps_ >= 0, "warmup_steps must be non-negative, got ", warmup_steps_);
  TORCH_CHECK_VALUE(warmup_ratio_ >= 0 && warmup_ratio_ <= 1,
                    "warmup_ratio must lie in range [0,1], got ", repr(warmup_ratio_));

  // Intervals. HF: a value above 1 must be a whole number of steps; below 1 it is a ratio.
  const auto check_interval = [](const char* field, double steps) {
    TORCH_CHECK_VALUE(steps <= 1 || steps == std::floor(steps), "--", field,
                      " must be an integer if bigger than 1: ", repr(steps));
  };
  if (logging_strategy_ == "steps") {
    TORCH_CHECK_VALUE(logging_steps_ > 0,
                      "logging strategy steps requires non-zero --logging_steps (a positive "
                      "number of steps, or a ratio in (0, 1)), got logging_steps=",
                      repr(logging_steps_));
    check_interval("logging_steps", logging_steps_);
  }
  if (eval_strategy_ == "steps") {
    TORCH_CHECK_VALUE(!eval_steps_ || *eval_steps_ >= 0,
                      "eval_steps must be positive (or unset to follow logging_steps), got ",
                      repr(eval_steps_));
    TORCH_CHECK_VALUE(resolved_eval_steps() > 0,
                      "evaluation strategy steps requires either non-zero --eval_steps or "
                      "--logging_steps, got eval_steps=",
                      repr(eval_steps_), " and logging_steps=", repr(logging_steps_));
    check_interval("eval_steps", resolved_eval_steps());
  }
  if (save_strategy_ == "steps") {
    TORCH_CHECK_VALUE(save_steps_ > 0,
                      "save strategy steps requires a positive --save_steps (a number of steps, or "
                      "a ratio in (0, 1)), got save_steps=",
                      repr(save_steps_));
    check_interval("save_steps", save_steps_);
  }
  // Whatever the strategy, the Trainer turns each interval into a step count (and records it in
  // trainer_state.json, as HF does), so each must be one: not negative, and within int64.
  check_step_count("logging_steps", logging_steps_);
  check_step_count("save_steps", save_steps_);
  if (eval_steps_) check_step_count("eval_steps", *eval_steps_);
  TORCH_CHECK_VALUE(save_strategy_ != "best" || eval_strategy_ != "no",
                    "save_strategy best saves when the evaluation loss improves, so it requires "
                    "an eval_strategy of steps or epoch, got eval_strategy='no'");
  TORCH_CHECK_VALUE(!save_total_limit_ || *save_total_limit_ >= 1,
                    "save_total_limit must be at least 1 (or None to keep every checkpoint), got ",
                    repr(save_total_limit_));
  TORCH_CHECK_VALUE(!resume_from_checkpoint_ || !resume_from_checkpoint_->empty(),
                    "resume_from_checkpoint must be a checkpoint folder or 'latest', got ''");

  // Loss scaling.
  TORCH_CHECK_VALUE(loss_scale_ >= 0,
                    "loss_scale must be non-negative (0 = dynamic loss scaling), got ",
                    repr(loss_scale_));
  TORCH_CHECK_VALUE(initial_scale_power_ >= 0 && initial_scale_power_ <= 127,
                    "initial_scale_power must be in [0, 127] (2^128 overflows float32), got ",
                    initial_scale_power_);
  TORCH_CHECK_VALUE(loss_scale_window_ >= 1, "loss_scale_window must be at least 1, got ",
                    loss_scale_window_);
  TORCH_CHECK_VALUE(hysteresis_ >= 1,
                    "hysteresis must be at least 1 (1 = back off on every overflow), got ",
                    hysteresis_);
  TORCH_CHECK_VALUE(min_loss_scale_ >= 0, "min_loss_scale must be non-negative, got ",
                    repr(min_loss_scale_));
  // The scale lives in a float32 tensor (as torch.amp.GradScaler's does): a larger value would
  // be inf there, and every step would overflow.
  const auto check_float32 = [](const char* field, double scale) {
    TORCH_CHECK_VALUE(scale <= std::numeric_limits<float>::max(), "--", field, " ", repr(scale),
                      " does not fit in the float32 that holds the loss scale (at most ",
                      repr(static_cast<double>(std::numeric_limits<float>::max())), ")");
  };
  check_float32("loss_scale", loss_scale_);
  check_float32("min_loss_scale", min_loss_scale_);
  if (max_loss_scale_) check_float32("max_loss_scale", *max_loss_scale_);
  if (max_loss_scale_) {
    TORCH_CHECK_VALUE(*max_loss_scale_ > 0 && *max_loss_scale_ >= min_loss_scale_,
                      "max_loss_scale must be positive and >= min_loss_scale, got max_loss_scale=",
                      repr(*max_loss_scale_), " and min_loss_scale=", repr(min_loss_scale_));
  }
  TORCH_CHECK_VALUE(max_consecutive_nonfinite_ >= 0,
                    "max_consecutive_nonfinite must be non-negative (0 = never stop), got ",
                    max_consecutive_nonfinite_);

  // Data loading.
  TORCH_CHECK_VALUE(dataloader_num_workers_ >= 0,
                    "dataloader_num_workers must be non-negative, got ", dataloader_num_workers_);
  TORCH_CHECK_VALUE(cuda_graph_warmup_steps_ >= 1,
                    "cuda_graph_warmup_steps must be at least 1 (the optimizer state is made by an "
                    "eager step), got ", cuda_graph_warmup_steps_);

  // Hardware: only asked when a precision mode needs it, so plain fp32 runs never touch CUDA.
  if (bf16_ || fp16_ || bf16_full_eval_ || fp16_full_eval_ || tf32_.value_or(false)) {
    detail::check_precision_support(*this, detail::query_device_info());
  }
}

// =============================================================================================
// Command line

TrainingArguments TrainingArguments::parse(int argc, const char* const* argv) {
  auto [args, remaining] = parse_impl(argc, argv);
  if (!remaining.empty()) {
    std::string joined;
    for (const auto& r : remaining) joined += (joined.empty() ? "" : " ") + r;
    TORCH_CHECK_VALUE(false, "unrecognized arguments: ", joined);
  }
  args.validate();
  return args;
}

TrainingArguments TrainingArguments::parse(int argc, char** argv) {
  return parse(argc, const_cast<const char* const*>(argv));
}

namespace {
std::vector<const char*> make_argv(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"train"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return argv;
}
}  // namespace

TrainingArguments TrainingArguments::parse(const std::vector<std::string>& args) {
  const auto argv = make_argv(args);
  return parse(static_cast<int>(argv.size()), argv.data());
}

std::pair<TrainingArguments, std::vector<std::string>> TrainingArguments::parse_known(
    int argc, const char* const* argv) {
  auto result = parse_impl(argc, argv);
  result.first.validate();
  return result;
}

std::pair<TrainingArguments, std::vector<std::string>> TrainingArguments::parse_known(
    int argc, char** argv) {
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

// =============================================================================================
// JSON

std::string TrainingArguments::to_json() const {
  Json j = Json::object();
#define MANTISSA_TA_TO_JSON_(type, name, default_value, help) j[#name] = to_json_value(#name, name##_);
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_TO_JSON_)
#undef MANTISSA_TA_TO_JSON_
  try {
    return j.dump(2);
  } catch (const Json::type_error& e) {  // a string field that is not valid UTF-8
    TORCH_CHECK_VALUE(false, "to_json: ", e.what());
  }
}

TrainingArguments TrainingArguments::from_json(const std::string& text, bool validate) {
  Json j;
  try {
    j = io::parse_json_text<Json>(text);
  } catch (const io::JsonTextError& e) {
    TORCH_CHECK_VALUE(false, "from_json: not valid JSON: ", e.what());
  }
  TORCH_CHECK_VALUE(j.is_object(), "from_json: expected a JSON object of TrainingArguments fields, got ",
                    j.type_name());
  TrainingArguments args;
  std::vector<std::string> unknown;
  for (const auto& [key, value] : j.items()) {
    bool known = false;
#define MANTISSA_TA_FROM_JSON_(type, name, default_value, help) \
  if (!known && key == #name) {                                 \
    from_json_value(#name, value, args.name##_);                \
    known = true;                                               \
  }
    MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_FROM_JSON_)
#undef MANTISSA_TA_FROM_JSON_
    if (!known) unknown.push_back(key);
  }
  TORCH_CHECK_VALUE(unknown.empty(), "from_json: unknown key", unknown.size() > 1 ? "s " : " ",
                    unknown_keys_text(unknown), ": TrainingArguments has no such field");
  if (validate) args.validate();
  return args;
}

void TrainingArguments::save_json(const std::string& path) const {
  io::write_file_atomically(path, to_json() + "\n");
}

TrainingArguments TrainingArguments::load_json(const std::string& path, bool validate) {
  std::vector<char> bytes;
  try {
    bytes = io::read_file(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot load training arguments from '", path, "': ", e.msg());
  }
  try {
    return from_json(std::string(bytes.begin(), bytes.end()), validate);
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "'", path, "': ", e.msg());
  }
}

// =============================================================================================
// Derived values

c10::ScalarType TrainingArguments::compute_dtype() const {
  TORCH_CHECK_VALUE(!(fp16_ && bf16_), "At most one of fp16 and bf16 can be True, but not both");
  if (bf16_) return c10::kBFloat16;
  if (fp16_) return c10::kHalf;
  return c10::kFloat;
}

c10::Device TrainingArguments::device() const {
  if (use_cpu_ || !torch::cuda::is_available()) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, 0);
}

double TrainingArguments::init_loss_scale() const {
  if (loss_scale_ > 0) return loss_scale_;
  return std::ldexp(1.0, static_cast<int>(initial_scale_power_));
}

double TrainingArguments::resolved_eval_steps() const {
  return eval_steps_ && *eval_steps_ != 0 ? *eval_steps_ : logging_steps_;
}

int64_t TrainingArguments::resolve_steps(double steps, int64_t max_steps) {
  // validate() keeps the intervals in range; this keeps a direct call defined.
  TORCH_CHECK_VALUE(steps >= 0 && steps < 0x1p63, "resolve_steps: ", repr(steps),
                    " is not a number of steps: it must lie in [0, ", detail::kMaxCount, "]");
  TORCH_CHECK_VALUE(max_steps >= 0, "resolve_steps: max_steps must be non-negative, got ",
                    max_steps);
  // A ratio below 1 of at most 2^63 steps stays below 2^63.
  if (steps < 1) return static_cast<int64_t>(std::ceil(steps * static_cast<double>(max_steps)));
  return static_cast<int64_t>(steps);
}

int64_t TrainingArguments::get_warmup_steps(int64_t num_training_steps) const {
  if (warmup_steps_ > 0) return warmup_steps_;
  // In double, a run near 2^63 steps rounds up to 2^63, one past int64: then the warmup is the
  // whole run (warmup_ratio <= 1).
  const double steps = std::ceil(static_cast<double>(num_training_steps) * warmup_ratio_);
  return detail::fits_int64(steps) ? static_cast<int64_t>(steps) : num_training_steps;
}

bool TrainingArguments::operator==(const TrainingArguments& other) const {
#define MANTISSA_TA_EQ_(type, name, default_value, help) \
  if (!(name##_ == other.name##_)) return false;
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_EQ_)
#undef MANTISSA_TA_EQ_
  return true;
}

}  // namespace mantissa
