#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <mantissa/trainer_callback.h>

/// The integrations `report_to` can name: a registry of name -> callback factory. Python:
/// `transformers.integrations.INTEGRATION_TO_CALLBACK` together with
/// `get_available_reporting_integrations()` (what `"all"` means).
///
/// mantissa registers its own (`tensorboard`) the first time the registry is used; a program
/// adds its own with `register_integration`, after which `report_to` accepts the name and
/// `all` includes it:
///
///     mantissa::register_integration(
///         "my_tracker", [] { return std::make_shared<MyTrackerCallback>(); },
///         "sends the logs to my tracker");
///     auto args = mantissa::TrainingArguments().report_to("tensorboard,my_tracker");
///
/// Every function here is safe to call from several threads, and from static initialisers of
/// any translation unit (the registry is a function-local static). Register before making the
/// `TrainingArguments` that name the integration: `report_to("all")` takes the names
/// registered at that moment. Nothing here touches a device.

namespace mantissa {

/// Makes the callback of one integration; called once for each Trainer that reports to it.
/// Python: the callback class `INTEGRATION_TO_CALLBACK` maps the name to.
using IntegrationFactory = std::function<std::shared_ptr<TrainerCallback>()>;

/// One registered integration: its name in `report_to`, and what it does in one line (shown by
/// `--help` and by the error for an unknown name).
struct IntegrationInfo {
  std::string name;
  std::string description;
};

/// Registers the integration `name`, whose callback `factory` makes. Throws `c10::ValueError`
/// naming the value when `name` is empty, holds a comma (the command line's separator) or
/// whitespace, is "none" or "all", or is registered already, or when `factory` is empty.
/// There is no unregistering: a name stays valid for the life of the process.
void register_integration(const std::string& name, IntegrationFactory factory,
                          const std::string& description = "");

/// Every registered integration, in the order registered (mantissa's own first). Python:
/// `get_available_reporting_integrations()`.
std::vector<IntegrationInfo> registered_integrations();

/// Whether `name` is a registered integration.
bool is_registered_integration(std::string_view name);

/// A new callback of the integration `name`. Throws `c10::ValueError` naming `name` and the
/// registered names when no integration has it, or when its factory returns null. Python:
/// `INTEGRATION_TO_CALLBACK[name]()`.
std::shared_ptr<TrainerCallback> make_integration_callback(std::string_view name);

}  // namespace mantissa
