#include "trainer/optimizer_family.h"

#include <algorithm>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/serialize/output-archive.h>

#include <mantissa/optim/optimizer_registry.h>

#include "io/archive_file.h"

namespace mantissa::detail {
namespace {

// The family whose marks (in the optimizer registry) are all among `keys`, or nullopt.
std::optional<std::string> family_of(const std::vector<std::string>& keys) {
  for (const auto& spec : optim::registered_optimizers()) {
    if (spec.family_marks.empty()) continue;
    if (std::all_of(spec.family_marks.begin(), spec.family_marks.end(),
                    [&](const std::string& mark) {
                      return std::find(keys.begin(), keys.end(), mark) != keys.end();
                    })) {
      return spec.family;
    }
  }
  return std::nullopt;
}

// The option names of the first parameter group in an archive written by
// torch::optim::serialize (torch/optim/serialize.h): param_groups/param_groups/0/options.
std::optional<std::vector<std::string>> saved_option_names(
    torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive groups, group, options;
  if (!archive.try_read("param_groups", groups) || !groups.try_read("param_groups/0", group) ||
      !group.try_read("options", options)) {
    return std::nullopt;
  }
  auto keys = options.keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::vector<std::string> live_option_names(torch::optim::Optimizer& optimizer) {
  if (optimizer.param_groups().empty()) return {};
  torch::serialize::OutputArchive out;
  optimizer.param_groups().front().options().serialize(out);
  const auto text = io::archive_bytes(out);
  torch::serialize::InputArchive in;
  in.load_from(text.data(), text.size());
  auto keys = in.keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

void check_optimizer_family(torch::optim::Optimizer& optimizer,
                            torch::serialize::InputArchive& archive) {
  const auto saved = saved_option_names(archive);
  if (!saved) return;
  const auto live = live_option_names(optimizer);
  const auto saved_family = family_of(*saved);
  const auto live_family = family_of(live);
  if (saved_family == live_family && (saved_family || *saved == live)) return;
  TORCH_CHECK_VALUE(false, "optimizer.pt holds the state of ",
                    saved_family ? "an " + *saved_family + " optimizer" : "an unknown optimizer",
                    " (options ", joined(*saved), "), but this run's optimizer is ",
                    c10::demangle(typeid(optimizer).name()), " (options ", joined(live),
                    "); resume with the optimizer that saved it (--optim)");
}

}  // namespace mantissa::detail
