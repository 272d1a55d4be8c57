// Choosing how a run computes, from the arguments and the model's parameter dtype.
#include "trainer/precision_plan.h"

#include <fmt/format.h>

#include <c10/util/Exception.h>

#include <mantissa/optim/optimizer_registry.h>

namespace mantissa {

std::string PrecisionPlan::describe() const {
  auto name = [](c10::ScalarType t) -> std::string {
    switch (t) {
      case c10::kBFloat16:
        return "bf16";
      case c10::kHalf:
        return "fp16";
      case c10::kFloat:
        return "fp32";
      case c10::kDouble:
        return "fp64";
      default:
        return c10::toString(t);
    }
  };
  std::string compute =
      autocast ? name(compute_dtype) + " autocast" : name(compute_dtype) + " compute";
  std::string weights_text;
  switch (weights) {
    case WeightsMode::kModelWeights:
      weights_text = name(param_dtype) + " weights";
      break;
    case WeightsMode::kFp32Masters:
      weights_text = name(param_dtype) + " weights with fp32 master weights";
      break;
    case WeightsMode::kPureLowPrecision:
      weights_text = "pure " + name(param_dtype) + " weights (no master copy), " +
                     optim::to_string(low_precision_update) + " updates";
      break;
  }
  std::string scaling = !loss_scaling ? std::string("no loss scaling")
                        : static_loss_scale
                            ? fmt::format("static loss scale {:g}", *static_loss_scale)
                            : std::string("dynamic loss scaling");
  std::string tf32_text = tf32.has_value() ? (*tf32 ? ", tf32 on" : ", tf32 off") : "";
  std::string fp8_text;
  if (fp8) {
    fp8_text = "; " + (fp8_layers.empty()
                           ? fmt::format("fp8 {} (the layers are chosen when training starts)",
                                         fp8::to_string(fp8->recipe()))
                           : fp8_layers);
  }
  return fmt::format("{}, {}, {}{}{}", compute, weights_text, scaling, tf32_text, fp8_text);
}

namespace detail {

optim::LowPrecisionUpdate low_precision_update_rule(const TrainingArguments& args) {
  switch (args.low_precision_update().value()) {
    case LowPrecisionUpdateMode::kAuto:
      return optim::find_optimizer(args.optim().name())->low_precision_rules
                 ? optim::LowPrecisionUpdate::kKahan
                 : optim::LowPrecisionUpdate::kNearest;
    case LowPrecisionUpdateMode::kNearest:
      return optim::LowPrecisionUpdate::kNearest;
    case LowPrecisionUpdateMode::kKahan:
      return optim::LowPrecisionUpdate::kKahan;
    case LowPrecisionUpdateMode::kStochasticRounding:
      return optim::LowPrecisionUpdate::kStochasticRounding;
  }
  return optim::LowPrecisionUpdate::kNearest;
}

namespace {

PrecisionPlan plan_without_warnings(const TrainingArguments& args, c10::ScalarType param_dtype);

// An update rule the arguments name explicitly but the plan does not use (the weights are not
// pure bf16/fp16, so the optimizer updates fp32 values and rounds nothing): worth a warning, as
// nothing else would tell the user.
void warn_unused_update_rule(const TrainingArguments& args, const PrecisionPlan& plan) {
  const auto mode = args.low_precision_update().value();
  if (mode == LowPrecisionUpdateMode::kAuto || mode == LowPrecisionUpdateMode::kNearest ||
      plan.weights == WeightsMode::kPureLowPrecision) {
    return;
  }
  TORCH_WARN("--low_precision_update ", args.low_precision_update(), " has no effect in this run (",
             plan.describe(),
             "): it changes how the optimizer rounds pure bf16/fp16 weights, which only a bf16 "
             "or fp16 model with --master_weights off has");
}

}  // namespace

PrecisionPlan make_precision_plan(const TrainingArguments& args, c10::ScalarType param_dtype) {
  PrecisionPlan plan = plan_without_warnings(args, param_dtype);
  // Which layers run in FP8 is known once the model is converted (Trainer::Impl::prepare).
  if (args.fp8()) plan.fp8 = args.float8_recipe();
  warn_unused_update_rule(args, plan);
  return plan;
}

namespace {

PrecisionPlan plan_without_warnings(const TrainingArguments& args, c10::ScalarType param_dtype) {
  PrecisionPlan plan;
  plan.param_dtype = param_dtype;
  plan.tf32 = args.tf32();
  const bool low_params = param_dtype == c10::kBFloat16 || param_dtype == c10::kHalf;
  const MasterWeightsMode masters = args.master_weights().value();

  if (low_params) {
    // The model's dtype decides the compute dtype; a contradicting flag is an error.
    TORCH_CHECK_VALUE(!(args.fp16() && param_dtype == c10::kBFloat16),
                      "the model's parameters are bf16 but --fp16 was given; use --bf16 (or load "
                      "the model in fp32)");
    TORCH_CHECK_VALUE(!(args.bf16() && param_dtype == c10::kHalf),
                      "the model's parameters are fp16 but --bf16 was given; use --fp16 (or load "
                      "the model in fp32)");
    plan.compute_dtype = param_dtype;
    plan.autocast = true;  // casts fp32 inputs to the model's dtype at matmuls and convs
    plan.weights = masters == MasterWeightsMode::kOff ? WeightsMode::kPureLowPrecision
                                                      : WeightsMode::kFp32Masters;
    if (plan.weights == WeightsMode::kPureLowPrecision) {
      plan.low_precision_update = low_precision_update_rule(args);
    }
    plan.loss_scaling = param_dtype == c10::kHalf;
    if (plan.loss_scaling && !args.dynamic_loss_scale()) plan.static_loss_scale = args.loss_scale();
    TORCH_CHECK_VALUE(
        !(plan.weights == WeightsMode::kPureLowPrecision && plan.loss_scaling),
        "master_weights=off with an fp16 model: fp16 gradients cannot be unscaled in place "
        "(\"Attempting to unscale FP16 gradients.\"). Use master_weights=auto, or a bf16 model.");
    return plan;
  }

  TORCH_CHECK_VALUE(param_dtype == c10::kFloat || param_dtype == c10::kDouble,
                    "unsupported parameter dtype ", param_dtype, " (expected fp32, bf16 or fp16)");
  if (!args.bf16() && !args.fp16()) {
    plan.compute_dtype = param_dtype;
    return plan;
  }
  plan.compute_dtype = args.compute_dtype();
  plan.loss_scaling = args.fp16();
  if (plan.loss_scaling && !args.dynamic_loss_scale()) plan.static_loss_scale = args.loss_scale();
  if (masters == MasterWeightsMode::kOn) {
    // fp32 model, --bf16/--fp16 and master_weights=on: train low-precision parameters with
    // fp32 masters (half the weight memory of AMP's fp32 model in the forward pass).
    plan.param_dtype = plan.compute_dtype;
    plan.weights = WeightsMode::kFp32Masters;
  }
  plan.autocast = true;
  return plan;
}

}  // namespace
c10::ScalarType floating_param_dtype(const torch::nn::Module& module) {
  std::optional<c10::ScalarType> dtype;
  for (const auto& item : module.named_parameters()) {
    const auto t = item.value().scalar_type();
    if (!c10::isFloatingType(t)) continue;
    if (!dtype) dtype = t;
    TORCH_CHECK_VALUE(*dtype == t, "the model mixes parameter dtypes (", *dtype, " and ", t,
                      " in '", item.key(),
                      "'); the Trainer expects one floating dtype for all parameters");
  }
  TORCH_CHECK_VALUE(dtype.has_value(), "the model has no floating-point parameters to train");
  return *dtype;
}

}  // namespace detail
}  // namespace mantissa
