// LrScheduler: PyTorch's LambdaLR over a LibTorch optimizer (the lr of each param group from its
// base lr and the schedule's factor), its state dict under LambdaLR's keys, and scheduler.pt.
#include <mantissa/lr_scheduler.h>

#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

#include <c10/util/Exception.h>

#include "io/atomic_file.h"
#include "io/torch_load.h"
#include "io/torch_save.h"
#include "lr_scheduler/schedules.h"

namespace mantissa {
namespace {

c10::List<double> to_list(const std::vector<double>& values) {
  c10::List<double> list;
  for (const double value : values) list.push_back(value);
  return list;
}

std::vector<double> as_double_list(const c10::IValue& value, const char* key) {
  TORCH_CHECK_VALUE(value.isList() || value.isDoubleList() || value.isIntList(),
                    "LrScheduler state dict: '", key, "' must be a list of floats, got ",
                    value.tagKind());
  std::vector<double> out;
  for (const auto& item : value.toListRef()) {
    TORCH_CHECK_VALUE(item.isDouble() || item.isInt(), "LrScheduler state dict: '", key,
                      "' must be a list of floats, but holds a ", item.tagKind());
    out.push_back(item.isDouble() ? item.toDouble() : static_cast<double>(item.toInt()));
  }
  return out;
}

}  // namespace

LrScheduler::LrScheduler(torch::optim::Optimizer& optimizer, const Choice<SchedulerType>& type,
                         std::int64_t num_warmup_steps, std::int64_t num_training_steps,
                         const LrSchedulerKwargs& kwargs)
    : optimizer_(&optimizer),
      type_(type.name()),
      num_warmup_steps_(num_warmup_steps),
      num_training_steps_(num_training_steps),
      kwargs_(kwargs) {
  const SchedulerType schedule = type.value();
  TORCH_CHECK(!optimizer.param_groups().empty(), "LrScheduler: the optimizer has no param groups");
  std::optional<double> initial_lr;
  if (detail::schedule_needs_initial_lr(schedule, kwargs)) {
    initial_lr = optimizer.defaults().get_lr();
  }
  const detail::ResolvedSchedule params =
      detail::resolve_schedule(schedule, num_warmup_steps, num_training_steps, kwargs, initial_lr);
  lr_lambda_ = [params](std::int64_t step) { return detail::schedule_factor_at(params, step); };
  for (const auto& group : optimizer.param_groups()) base_lrs_.push_back(group.options().get_lr());
  // LambdaLR's constructor takes the initial step: last_epoch -1 -> 0, lr = base_lr * factor(0).
  last_epoch_ = -1;
  step();
}

LrScheduler::LrScheduler(torch::optim::Optimizer& optimizer, LrLambda lr_lambda)
    : optimizer_(&optimizer),
      type_("lambda"),
      lr_lambda_(std::move(lr_lambda)),
      num_warmup_steps_(0),
      num_training_steps_(0) {
  TORCH_CHECK_VALUE(static_cast<bool>(lr_lambda_), "LrScheduler: the lr_lambda is empty");
  TORCH_CHECK(!optimizer.param_groups().empty(), "LrScheduler: the optimizer has no param groups");
  for (const auto& group : optimizer.param_groups()) base_lrs_.push_back(group.options().get_lr());
  last_epoch_ = -1;
  step();
}

void LrScheduler::step() {
  ++step_count_;
  ++last_epoch_;
  apply_lr();
}

void LrScheduler::apply_lr() {
  const double f = lr_lambda_(last_epoch_);
  auto& groups = optimizer_->param_groups();
  TORCH_CHECK(groups.size() == base_lrs_.size(), "LrScheduler: the optimizer has ", groups.size(),
              " param groups but the scheduler was built for ", base_lrs_.size());
  last_lr_.clear();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const double lr = base_lrs_[i] * f;
    groups[i].options().set_lr(lr);
    last_lr_.push_back(lr);
  }
}

c10::impl::GenericDict LrScheduler::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("base_lrs", to_list(base_lrs_));
  state.insert("last_epoch", last_epoch_);
  state.insert("_step_count", step_count_);
  state.insert("_is_initial", false);
  state.insert("_get_lr_called_within_step", false);
  state.insert("_last_lr", to_list(last_lr_));
  c10::impl::GenericList lr_lambdas(
      c10::DictType::create(c10::StringType::get(), c10::AnyType::get()));
  for (std::size_t i = 0; i < base_lrs_.size(); ++i) {
    lr_lambdas.push_back(c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  }
  state.insert("lr_lambdas", lr_lambdas);
  return state;
}

void LrScheduler::load_state_dict(const c10::impl::GenericDict& state) {
  auto get = [&](const char* key) -> c10::IValue {
    TORCH_CHECK_VALUE(state.contains(key), "LrScheduler state dict has no key '", key, "'");
    return state.at(key);
  };
  auto as_int = [&](const char* key) {
    const auto value = get(key);
    TORCH_CHECK_VALUE(value.isInt(), "LrScheduler state dict: '", key, "' must be an int, got ",
                      value.tagKind());
    return value.toInt();
  };
  std::vector<double> base_lrs = as_double_list(get("base_lrs"), "base_lrs");
  const std::int64_t last_epoch = as_int("last_epoch");
  const std::size_t num_groups = optimizer_->param_groups().size();
  TORCH_CHECK_VALUE(base_lrs.size() == num_groups, "LrScheduler state dict: 'base_lrs' has ",
                    base_lrs.size(), " entries but the optimizer has ", num_groups,
                    " param groups");
  // A learning rate is a finite number >= 0, and a constructed scheduler has stepped at least
  // once (last_epoch 0): anything else would feed nan or a negative rate into the optimizer.
  auto check_rates = [](const std::vector<double>& rates, const char* key) {
    for (std::size_t i = 0; i < rates.size(); ++i) {
      TORCH_CHECK_VALUE(std::isfinite(rates[i]) && rates[i] >= 0, "LrScheduler state dict: '", key,
                        "'[", i, "] is ", rates[i],
                        ", but a learning rate must be a finite number >= 0");
    }
  };
  check_rates(base_lrs, "base_lrs");
  TORCH_CHECK_VALUE(last_epoch >= 0 && last_epoch < std::numeric_limits<std::int64_t>::max(),
                    "LrScheduler state dict: 'last_epoch' is ", last_epoch,
                    ", but it counts the steps taken and must be >= 0");
  std::int64_t step_count = last_epoch + 1;
  if (state.contains("_step_count")) step_count = as_int("_step_count");
  TORCH_CHECK_VALUE(step_count >= 0, "LrScheduler state dict: '_step_count' is ", step_count,
                    ", but it must be >= 0");
  std::vector<double> last_lr;
  if (state.contains("_last_lr")) {
    last_lr = as_double_list(state.at("_last_lr"), "_last_lr");
    TORCH_CHECK_VALUE(last_lr.size() == num_groups, "LrScheduler state dict: '_last_lr' has ",
                      last_lr.size(), " entries but the optimizer has ", num_groups,
                      " param groups");
    check_rates(last_lr, "_last_lr");
  } else {
    const double f = lr_lambda_(last_epoch);
    for (const double base_lr : base_lrs) last_lr.push_back(base_lr * f);
  }
  base_lrs_ = std::move(base_lrs);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  last_lr_ = std::move(last_lr);
}

void LrScheduler::save(const std::string& path) const {
  // Not torch::pickle_save: its type tags make Python's torch.load(weights_only=True) refuse
  // the file, and HF's Trainer loads scheduler.pt that way.
  const auto bytes = io::torch_save_bytes(c10::IValue(state_dict()));
  io::write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
}

void LrScheduler::load(const std::string& path) {
  const auto value = io::load_torch_file(path);
  TORCH_CHECK_VALUE(value.isGenericDict(), "'", path,
                    "' does not hold an LrScheduler state dict, but a ", value.tagKind());
  load_state_dict(value.toGenericDict());
}

}  // namespace mantissa
