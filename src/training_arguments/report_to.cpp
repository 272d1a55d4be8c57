// ReportTo: report_to's list of integration names, with HF's meaning of "none" and "all".
#include <mantissa/report_to.h>

#include <utility>

#include <c10/util/Exception.h>

#include <mantissa/integrations.h>

namespace mantissa {
namespace {

std::vector<std::string> split_at_commas(const std::string& text) {
  std::vector<std::string> names;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    names.push_back(text.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) return names;
    start = comma + 1;
  }
}

// HF's __post_init__: a list that is exactly ["none"] is empty, exactly ["all"] every
// integration there is; any other list stays as given, for validate() to judge.
std::vector<std::string> normalised(std::vector<std::string> names) {
  if (names.size() != 1) return names;
  if (names.front() == "none") return {};
  if (names.front() != "all") return names;
  std::vector<std::string> all;
  for (auto& info : registered_integrations()) all.push_back(std::move(info.name));
  return all;
}

std::string checked_text(const char* text) {
  TORCH_CHECK_VALUE(text != nullptr, "report_to: got a null string");
  return text;
}

}  // namespace

ReportTo::ReportTo(const char* text) : ReportTo(checked_text(text)) {}

ReportTo::ReportTo(const std::string& text) : names_(normalised(split_at_commas(text))) {}

ReportTo::ReportTo(std::initializer_list<std::string> names)
    : ReportTo(std::vector<std::string>(names)) {}

ReportTo::ReportTo(std::vector<std::string> names) : names_(normalised(std::move(names))) {}

std::string ReportTo::text() const {
  if (names_.empty()) return "none";
  std::string text = names_.front();
  for (std::size_t i = 1; i < names_.size(); ++i) text += "," + names_[i];
  return text;
}

}  // namespace mantissa
