#include "training_arguments/reporting_checks.h"

#include <algorithm>
#include <cstddef>

#include <c10/util/Exception.h>

#include <mantissa/integrations.h>

#include "shorten.h"

namespace mantissa::detail {
namespace {

std::string registered_names() {
  std::string text;
  for (const auto& info : registered_integrations()) {
    text += (text.empty() ? "" : ", ") + info.name;
  }
  return text;
}

}  // namespace

void check_report_to(const ReportTo& report_to) {
  const auto& names = report_to.names();
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& name = names[i];
    const std::string shown =
        "report_to: '" + shorten(name) + "' (in '" + shorten(report_to.text()) + "')";
    TORCH_CHECK_VALUE(name != "none" && name != "all", shown, " stands for ",
                      name == "none" ? "no integration" : "every registered integration",
                      " and cannot be combined with other names; give it alone");
    TORCH_CHECK_VALUE(
        is_registered_integration(name), shown,
        " is not a registered integration; choose none, all, or names among: ", registered_names(),
        " (comma-separated; register_integration() of mantissa/integrations.h adds "
        "more)");
    TORCH_CHECK_VALUE(std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i),
                                name) == names.begin() + static_cast<std::ptrdiff_t>(i),
                      shown, " is named twice; each integration reports once");
  }
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
