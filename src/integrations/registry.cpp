// The registry of report_to's integrations: a function-local static, so that it exists
// (with mantissa's own entries) before its first use, whichever translation unit asks.
#include <mantissa/integrations.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <utility>

#include <c10/util/Exception.h>

#include "integrations/builtin_integrations.h"
#include "shorten.h"

namespace mantissa {
namespace {

class Registry {
 public:
  Registry() {
    for (const auto& entry : {detail::tensorboard_integration()}) add(entry);
  }

  void add(detail::IntegrationEntry entry) {
    const auto& name = entry.info.name;
    const bool spaced =
        std::any_of(name.begin(), name.end(), [](unsigned char c) { return std::isspace(c) != 0; });
    TORCH_CHECK_VALUE(!name.empty() && name.find(',') == std::string::npos && !spaced,
                      "register_integration: '", detail::shorten(name),
                      "' cannot name an integration: report_to needs a name that is not empty, "
                      "with no comma and no whitespace");
    TORCH_CHECK_VALUE(name != "none" && name != "all", "register_integration: '", name,
                      "' cannot name an integration: report_to reads it as ",
                      name == "none" ? "no integration" : "every integration");
    TORCH_CHECK_VALUE(static_cast<bool>(entry.factory), "register_integration: '", name,
                      "' has no factory (an empty std::function)");
    const std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK_VALUE(find(name) == entries_.end(), "register_integration: '", name,
                      "' is registered already");
    entries_.push_back(std::move(entry));
  }

  std::vector<IntegrationInfo> infos() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<IntegrationInfo> out;
    out.reserve(entries_.size());
    for (const auto& entry : entries_) out.push_back(entry.info);
    return out;
  }

  // The factory of `name`, empty when none is registered under it.
  IntegrationFactory factory(std::string_view name) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = find(name);
    return it == entries_.end() ? IntegrationFactory() : it->factory;
  }

 private:
  std::vector<detail::IntegrationEntry>::const_iterator find(std::string_view name) const {
    return std::find_if(entries_.begin(), entries_.end(),
                        [&](const detail::IntegrationEntry& e) { return e.info.name == name; });
  }

  mutable std::mutex mutex_;
  std::vector<detail::IntegrationEntry> entries_;  // in registration order
};

Registry& registry() {
  static Registry instance;
  return instance;
}

std::string names_text() {
  std::string text;
  for (const auto& info : registry().infos()) text += (text.empty() ? "" : ", ") + info.name;
  return text;
}

}  // namespace

void register_integration(const std::string& name, IntegrationFactory factory,
                          const std::string& description) {
  registry().add({{name, description}, std::move(factory)});
}

std::vector<IntegrationInfo> registered_integrations() { return registry().infos(); }

bool is_registered_integration(std::string_view name) {
  return static_cast<bool>(registry().factory(name));
}

std::shared_ptr<TrainerCallback> make_integration_callback(std::string_view name) {
  const auto factory = registry().factory(name);
  TORCH_CHECK_VALUE(static_cast<bool>(factory), "report_to: '", detail::shorten(std::string(name)),
                    "' is not a registered integration (registered: ", names_text(), ")");
  auto callback = factory();  // outside the lock: a factory may itself use the registry
  TORCH_CHECK_VALUE(callback != nullptr, "report_to: the factory of integration '", name,
                    "' returned a null callback");
  return callback;
}

}  // namespace mantissa
