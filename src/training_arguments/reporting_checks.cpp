#include "training_arguments/reporting_checks.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include <c10/util/Exception.h>

namespace mantissa::detail {
namespace {

// Whether `name` is one integration (not "none" or "all", which stand alone).
bool is_integration(std::string_view name) {
  const Choice<ReportTo> choice(name);
  return choice.is_valid() && choice != ReportTo::kNone && choice != ReportTo::kAll;
}

}  // namespace

void check_report_to(const Choice<ReportTo>& report_to) {
  if (report_to.is_valid()) return;
  // Not one spelling: then a list, whose names are checked one by one for the message.
  const std::string_view text = report_to.name();
  std::vector<std::string_view> seen;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = std::min(text.find(',', start), text.size());
    const auto name = text.substr(start, comma - start);
    TORCH_CHECK_VALUE(is_integration(name), "report_to: '", name, "' (in '", text,
                      "') is not an integration mantissa has; choose one of ",
                      Choice<ReportTo>::names_text(), " (several separated by commas)");
    for (const auto earlier : seen) {
      TORCH_CHECK_VALUE(earlier != name, "report_to: '", name, "' appears twice in '", text, "'");
    }
    seen.push_back(name);
    start = comma + 1;
  }
  // With one integration, a list of two or more names always repeats one (or names something
  // else), and a single name is a spelling of ReportTo: the loop has thrown.
  TORCH_INTERNAL_ASSERT(false, "report_to '", text, "' passed every name check");
}

void check_run_name(const std::optional<std::string>& run_name) {
  if (!run_name) return;
  const auto& name = *run_name;
  TORCH_CHECK_VALUE(!name.empty() && name != "." && name != ".." &&
                        name.find('/') == std::string::npos && name.find('\0') == std::string::npos,
                    "run_name must name one folder (not empty, '.' or '..', no '/'), got '", name,
                    "'");
}

}  // namespace mantissa::detail
