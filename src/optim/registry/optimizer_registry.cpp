// The registry's storage: the built-ins first, then what programs register. Entries are kept
// in a deque so that the pointers `find_optimizer` hands out stay valid as more are added.
#include <mantissa/optim/optimizer_registry.h>

#include <deque>
#include <mutex>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim {
namespace {

struct Registry {
  std::mutex mutex;
  std::deque<OptimizerSpec> entries;
};

void check_spec(const OptimizerSpec& spec, const std::deque<OptimizerSpec>& entries) {
  TORCH_CHECK_VALUE(spec.type != std::type_index(typeid(void)), "register_optimizer: the entry '",
                    spec.name, "' has no type (set OptimizerSpec::type to typeid(YourOptimizer))");
  const auto type_name = c10::demangle(spec.type.name());
  TORCH_CHECK_VALUE(spec.name.find_first_of(", \t\n") == std::string::npos,
                    "register_optimizer: the name '", spec.name, "' of ", type_name,
                    " holds a comma or a space; --optim takes one word");
  TORCH_CHECK_VALUE(spec.name.empty() || static_cast<bool>(spec.build),
                    "register_optimizer: the entry '", spec.name, "' (", type_name,
                    ") has a name but no build function");
  if (spec.name.empty()) return;
  for (const auto& entry : entries) {
    TORCH_CHECK_VALUE(entry.name != spec.name, "register_optimizer: the name '", spec.name,
                      "' is taken already (by ", c10::demangle(entry.type.name()), ")");
  }
}

Registry& registry() {
  static Registry* const instance = [] {
    auto* made = new Registry;  // never destroyed: lookups may run during static destruction
    for (auto& spec : detail::builtin_optimizers()) {
      check_spec(spec, made->entries);
      made->entries.push_back(std::move(spec));
    }
    return made;
  }();
  return *instance;
}

}  // namespace

void register_optimizer(OptimizerSpec spec) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  check_spec(spec, r.entries);
  r.entries.push_back(std::move(spec));
}

const OptimizerSpec* find_optimizer(std::string_view name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (name.empty()) return nullptr;
  for (const auto& entry : r.entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

const OptimizerSpec* find_optimizer_of(const torch::optim::Optimizer& optimizer) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::type_index type(typeid(optimizer));
  for (const auto& entry : r.entries) {
    if (entry.type == type) return &entry;
  }
  return nullptr;
}

std::vector<std::string> optimizer_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.entries) {
    if (!entry.name.empty()) names.push_back(entry.name);
  }
  return names;
}

std::string optimizer_names_text() {
  std::string out = "[";
  for (const auto& name : optimizer_names()) {
    out += (out.size() > 1 ? ", '" : "'") + name + "'";
  }
  return out + "]";
}

std::vector<OptimizerSpec> registered_optimizers() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return {r.entries.begin(), r.entries.end()};
}

namespace detail {

std::vector<OptimizerSpec> builtin_optimizers() {
  std::vector<OptimizerSpec> specs;
  specs.push_back(adamw_torch_spec());
  for (auto& spec : fused_adamw_specs()) specs.push_back(std::move(spec));
  specs.push_back(sgd_spec());
  specs.push_back(adafactor_spec());
  specs.push_back(adamw_8bit_spec());
  specs.push_back(muon_spec());
  specs.push_back(adam_torch_spec());
  specs.push_back(adagrad_spec());
  specs.push_back(rmsprop_spec());
  specs.push_back(lbfgs_spec());
  return specs;
}

}  // namespace detail
}  // namespace mantissa::optim
