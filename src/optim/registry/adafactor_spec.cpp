// "adafactor": mantissa's Adafactor with HF's Trainer settings (relative step and parameter
// scaling off, lr from learning_rate); optim_args sets the rest.
#include <mantissa/optim/adafactor.h>

#include "optim/optim_args.h"
#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {
namespace {

constexpr const char* kName = "adafactor";

// The options `args` ask for; throws for a bad or unknown optim_args key.
AdafactorOptions adafactor_options(const TrainingArguments& args) {
  OptimArgs extra(args.optim_args(), kName);
  AdafactorOptions options(args.learning_rate());
  options.eps(extra.take_double("eps", options.eps()))
      .clip_threshold(extra.take_double("clip_threshold", options.clip_threshold()))
      .decay_rate(extra.take_double("decay_rate", options.decay_rate()))
      .beta1(extra.take_optional_double("beta1", options.beta1()))
      .weight_decay(args.weight_decay());
  extra.finish();
  // The constructor's checks, run here so that validate() names the bad value too.
  Adafactor probe(std::vector<at::Tensor>{}, options);
  return options;
}

StateTensors adafactor_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const AdafactorParamState*>(&base);
  if (state == nullptr) return {};
  return {{"exp_avg_sq_row", state->exp_avg_sq_row(), true, /*param_shaped=*/false},
          {"exp_avg_sq_col", state->exp_avg_sq_col(), true, /*param_shaped=*/false},
          {"exp_avg_sq", state->exp_avg_sq(), /*non_negative=*/true},
          {"exp_avg", state->exp_avg()},
          {"kahan_comp", state->kahan_comp()}};
}

std::vector<GroupOption> adafactor_group_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const AdafactorOptions&>(base);
  std::vector<GroupOption> out{{"lr", options.lr()},
                               {"eps", options.eps()},
                               {"clip_threshold", options.clip_threshold()},
                               {"decay_rate", options.decay_rate(), /*non_negative=*/false},
                               {"weight_decay", options.weight_decay()}};
  if (options.beta1()) out.push_back({"beta1", *options.beta1()});
  return out;
}

}  // namespace

OptimizerSpec adafactor_spec() {
  OptimizerSpec spec;
  spec.name = kName;
  spec.type = typeid(Adafactor);
  spec.family = "Adafactor";
  spec.family_marks = {"clip_threshold", "decay_rate"};
  spec.build = [](OptimizerBuildInputs inputs) -> std::unique_ptr<torch::optim::Optimizer> {
    auto built = build_in_decay_groups<Adafactor>(inputs, adafactor_options(inputs.args));
    built->set_low_precision_update(inputs.low_precision_update,
                                    static_cast<std::uint64_t>(inputs.args.seed()));
    return built;
  };
  spec.check_arguments = [](const TrainingArguments& args) { adafactor_options(args); };
  spec.state_tensors = &adafactor_tensors;
  spec.steps = [](const torch::optim::OptimizerParamState& base) -> std::optional<double> {
    const auto* state = dynamic_cast<const AdafactorParamState*>(&base);
    if (state == nullptr) return std::nullopt;
    return static_cast<double>(state->step());
  };
  spec.group_options = &adafactor_group_options;
  spec.low_precision_rules = true;
  spec.shards_whole_tensors = true;
  return spec;
}

}  // namespace mantissa::optim::detail
