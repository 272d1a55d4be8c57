#pragma once
// Values printed as Python prints them (`repr`), so that messages and --help read like those
// of Hugging Face's TrainingArguments.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <mantissa/choice.h>
#include <mantissa/gradient_checkpointing_kwargs.h>
#include <mantissa/lr_scheduler_kwargs.h>
#include <mantissa/report_to.h>

namespace mantissa::detail {

/// `repr(float(v))`: the shortest digits that read back exactly, in Python's layout
/// ("5e-05", "3.0", "1e+20", "inf", "nan").
std::string py_float(double v);

/// `repr(v)` of a bool, an int, a float and a str ("True", "3", "0.5", "'text'").
std::string repr(bool v);
std::string repr(int64_t v);
std::string repr(double v);
std::string repr(const std::string& v);

/// `repr` of an enum value of HF's string enums: its spelling in quotes.
template <class E>
std::string repr(const Choice<E>& v) {
  return repr(std::string(v.name()));
}

/// `repr` of a list of strings: "['a', 'b']".
std::string repr(const std::vector<std::string>& v);
/// `repr` of a dict of `lr_scheduler_kwargs`: "{'num_cycles': 2, 'decay_type': 'cosine'}".
std::string repr(const LrSchedulerKwarg& v);
std::string repr(const LrSchedulerKwargs& v);
/// `repr` of `gradient_checkpointing_kwargs`, the keys that are set: "{'use_reentrant': False}".
std::string repr(const GradientCheckpointingKwargs& v);

/// `repr` of an optional: the value's, or "None".
template <class T>
std::string repr(const std::optional<T>& v) {
  return v ? repr(*v) : "None";
}

/// argparse's "(default: ...)" text: like `repr`, but strings (and enum spellings) unquoted.
template <class T>
std::string help_repr(const T& v) {
  return repr(v);
}
inline std::string help_repr(const std::string& v) { return v; }
inline std::string help_repr(const std::optional<std::string>& v) { return v ? *v : "None"; }
/// report_to as the command line spells it: "none", "tensorboard", "tensorboard,my_tracker".
inline std::string help_repr(const ReportTo& v) { return v.text(); }
template <class E>
std::string help_repr(const Choice<E>& v) {
  return std::string(v.name());
}

}  // namespace mantissa::detail
