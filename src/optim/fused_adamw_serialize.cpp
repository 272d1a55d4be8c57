// FusedAdamW's archives: the options and each parameter's state under torch::optim::AdamW's keys
// (plus ours), so that either optimizer reads the other's; load() puts the state back on the
// parameters' devices.
#include <mantissa/optim/fused_adamw.h>

#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include "optim/fused_adamw_options.h"

namespace mantissa::optim {

void FusedAdamWOptions::serialize(torch::serialize::OutputArchive& archive) const {
  // torch::optim::AdamWOptions' keys, so that AdamW reads them (and skips the rest, ours).
  archive.write("lr", c10::IValue(lr()));
  archive.write("betas", c10::IValue(betas()));
  archive.write("eps", c10::IValue(eps()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("amsgrad", c10::IValue(amsgrad()));
  archive.write("maximize", c10::IValue(maximize()));
  archive.write("low_precision_update",
                c10::IValue(std::string(to_string(low_precision_update()))));
  // IValue holds int64: the seed's bits, reinterpreted.
  archive.write("stochastic_rounding_seed",
                c10::IValue(static_cast<std::int64_t>(stochastic_rounding_seed())));
  archive.write("fp32_moments", c10::IValue(fp32_moments()));
}

void FusedAdamWOptions::serialize(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* key) {
    c10::IValue value;
    TORCH_CHECK_VALUE(archive.try_read(key, value), "FusedAdamW options: the archive has no '", key,
                      "'");
    return value;
  };
  lr(read("lr").toDouble());
  betas(read("betas").to<betas_t>());
  eps(read("eps").toDouble());
  weight_decay(read("weight_decay").toDouble());
  amsgrad(read("amsgrad").toBool());
  c10::IValue value;
  maximize(archive.try_read("maximize", value) ? value.toBool() : false);  // absent in AdamW's
  // Keys AdamW's archives lack (and ours written before an option existed) read as the option's
  // default.
  low_precision_update(archive.try_read("low_precision_update", value)
                           ? parse_low_precision_update(value.toStringRef())
                           : LowPrecisionUpdate::kNearest);
  stochastic_rounding_seed(archive.try_read("stochastic_rounding_seed", value)
                               ? static_cast<std::uint64_t>(value.toInt())
                               : 0);
  fp32_moments(archive.try_read("fp32_moments", value) ? value.toBool() : false);
}

void FusedAdamWParamState::serialize(torch::serialize::OutputArchive& archive) const {
  const std::int64_t steps =
      step().defined() ? static_cast<std::int64_t>(step().item<double>()) : 0;
  archive.write("step", c10::IValue(steps));
  if (exp_avg().defined()) archive.write("exp_avg", exp_avg());
  if (exp_avg_sq().defined()) archive.write("exp_avg_sq", exp_avg_sq());
  if (max_exp_avg_sq().defined()) archive.write("max_exp_avg_sq", max_exp_avg_sq());
  if (kahan_comp().defined()) archive.write("kahan_comp", kahan_comp());
}

void FusedAdamWParamState::serialize(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  if (archive.try_read("step", value)) {
    if (value.isTensor()) {
      step(value.toTensor().detach().to(at::kFloat).reshape({}).clone());
    } else {
      step(at::full({}, value.isInt() ? static_cast<double>(value.toInt()) : value.toDouble(),
                    at::kFloat));
    }
  }
  auto read_tensor = [&](const char* key) {
    c10::IValue tensor;
    return archive.try_read(key, tensor) ? tensor.toTensor() : at::Tensor();
  };
  exp_avg(read_tensor("exp_avg"));
  exp_avg_sq(read_tensor("exp_avg_sq"));
  max_exp_avg_sq(read_tensor("max_exp_avg_sq"));
  kahan_comp(read_tensor("kahan_comp"));
}

void FusedAdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedAdamWParamState, FusedAdamWOptions>(archive, *this);
}

void FusedAdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<FusedAdamWParamState, FusedAdamWOptions>(archive, *this);
  // The archive's tensors come back on the CPU, in the dtype they were saved with.
  std::size_t index = 0;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const FusedAdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      auto it = state_.find(p.unsafeGetTensorImpl());
      const auto position = index++;
      if (it == state_.end()) continue;
      auto& state = static_cast<FusedAdamWParamState&>(*it->second);
      // Refused before the cast below would hide it (an integer moment holds no fraction).
      for (const auto& [name, t] : {std::pair<const char*, at::Tensor>{"exp_avg", state.exp_avg()},
                                    {"exp_avg_sq", state.exp_avg_sq()},
                                    {"max_exp_avg_sq", state.max_exp_avg_sq()},
                                    {"kahan_comp", state.kahan_comp()}}) {
        TORCH_CHECK_VALUE(!t.defined() || at::isFloatingType(t.scalar_type()), "the state '", name,
                          "' of parameter ", position, " is ", t.scalar_type(),
                          ", not a floating-point tensor");
      }
      const auto on = p.options().requires_grad(false);
      const auto moments = on.dtype(detail::moment_dtype_for(options, p.scalar_type()));
      if (!state.step().defined()) state.step(at::zeros({}, on.dtype(at::kFloat)));
      state.step(state.step().to(on.dtype(at::kFloat)));
      if (state.exp_avg().defined()) state.exp_avg(state.exp_avg().to(moments));
      if (state.exp_avg_sq().defined()) state.exp_avg_sq(state.exp_avg_sq().to(moments));
      if (state.max_exp_avg_sq().defined())
        state.max_exp_avg_sq(state.max_exp_avg_sq().to(moments));
      if (state.kahan_comp().defined()) state.kahan_comp(state.kahan_comp().to(on));
    }
  }
}

}  // namespace mantissa::optim
