// "adamw_torch_8bit": mantissa's AdamW8bit with HF's arguments (torchao's AdamW8bit as HF's
// Trainer builds it: Adam's betas and epsilon from the arguments, block_size from optim_args).
#include <mantissa/optim/adamw_8bit.h>

#include "optim/optim_args.h"
#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {
namespace {

constexpr const char* kName = "adamw_torch_8bit";

AdamW8bitOptions adamw_8bit_options(const TrainingArguments& args) {
  OptimArgs extra(args.optim_args(), kName);
  auto options = AdamW8bitOptions(args.learning_rate())
                     .betas(std::make_tuple(args.adam_beta1(), args.adam_beta2()))
                     .eps(args.adam_epsilon())
                     .weight_decay(args.weight_decay());
  options.block_size(extra.take_int("block_size", options.block_size()));
  TORCH_CHECK_VALUE(!extra.take_bool("bf16_stochastic_round", false),
                    "optim_args: bf16_stochastic_round=True is not implemented for optim ", kName,
                    "; train a bf16 model with fp32 masters (master_weights auto) instead");
  extra.finish();
  AdamW8bit probe(std::vector<at::Tensor>{}, options);  // the constructor's checks, for validate()
  return options;
}

StateTensors adamw_8bit_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const AdamW8bitParamState*>(&base);
  if (state == nullptr) return {};
  StateTensor exp_avg_codes{"exp_avg_codes", state->exp_avg_codes()};
  exp_avg_codes.codes = true;
  StateTensor exp_avg_sq_codes{"exp_avg_sq_codes", state->exp_avg_sq_codes()};
  exp_avg_sq_codes.codes = true;
  return {exp_avg_codes,
          {"exp_avg_scale", state->exp_avg_scale(), /*non_negative=*/true, /*param_shaped=*/false},
          exp_avg_sq_codes,
          {"exp_avg_sq_scale", state->exp_avg_sq_scale(), true, /*param_shaped=*/false},
          {"exp_avg", state->exp_avg()},
          {"exp_avg_sq", state->exp_avg_sq(), /*non_negative=*/true},
          {"kahan_comp", state->kahan_comp()}};
}

std::vector<GroupOption> adamw_8bit_group_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const AdamW8bitOptions&>(base);
  return {{"lr", options.lr()},
          {"betas[0]", std::get<0>(options.betas()), true, /*below_one=*/true},
          {"betas[1]", std::get<1>(options.betas()), true, /*below_one=*/true},
          {"eps", options.eps()},
          {"weight_decay", options.weight_decay()},
          {"block_size", static_cast<double>(options.block_size())}};
}

}  // namespace

OptimizerSpec adamw_8bit_spec() {
  OptimizerSpec spec;
  spec.name = kName;
  spec.type = typeid(AdamW8bit);
  spec.family = "AdamW8bit";
  spec.family_marks = {"betas", "block_size"};
  spec.build = [](OptimizerBuildInputs inputs) -> std::unique_ptr<torch::optim::Optimizer> {
    auto built = build_in_decay_groups<AdamW8bit>(inputs, adamw_8bit_options(inputs.args));
    built->set_low_precision_update(inputs.low_precision_update,
                                    static_cast<std::uint64_t>(inputs.args.seed()));
    return built;
  };
  spec.check_arguments = [](const TrainingArguments& args) { adamw_8bit_options(args); };
  spec.state_tensors = &adamw_8bit_tensors;
  spec.low_precision_rules = true;
  spec.steps = [](const torch::optim::OptimizerParamState& base) -> std::optional<double> {
    const auto* state = dynamic_cast<const AdamW8bitParamState*>(&base);
    if (state == nullptr || !state->step().defined()) return std::nullopt;
    TORCH_CHECK_VALUE(state->step().numel() == 1, "its 'step' holds ", state->step().numel(),
                      " values instead of one");
    return state->step().item<double>();
  };
  spec.group_options = &adamw_8bit_group_options;
  spec.shards_whole_tensors = true;
  return spec;
}

}  // namespace mantissa::optim::detail
