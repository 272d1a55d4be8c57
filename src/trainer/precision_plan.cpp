// Choosing how a run computes, from the arguments and the model's parameter dtype.
#include "trainer/precision_plan.h"

#include <fmt/format.h>

#include <c10/util/Exception.h>

namespace mantissa {

std::string PrecisionPlan::describe() const {
  auto name = [](c10::ScalarType t) -> std::string {
    switch (t) {
      case c10::kBFloat16: return "bf16";
      case c10::kHalf: return "fp16";
      case c10::kFloat: return "fp32";
      case c10::kDouble: return "fp64";
      default: return c10::toString(t);
    }
  };
  std::string compute = autocast ? name(compute_dtype) + " autocast" : name(compute_dtype) + " compute";
  std::string weights = master_weights       ? name(param_dtype) + " weights with fp32 master weights"
                        : pure_low_precision ? "pure " + name(param_dtype) + " weights (no master copy)"
                                             : name(param_dtype) + " weights";
  std::string scaling = !loss_scaling       ? std::string("no loss scaling")
                        : static_loss_scale ? fmt::format("static loss scale {:g}", *static_loss_scale)
                                            : std::string("dynamic loss scaling");
  std::string tf32_text = tf32.has_value() ? (*tf32 ? ", tf32 on" : ", tf32 off") : "";
  return fmt::format("{}, {}, {}{}", compute, weights, scaling, tf32_text);
}

namespace detail {

PrecisionPlan make_precision_plan(const TrainingArguments& args, c10::ScalarType param_dtype) {
  PrecisionPlan plan;
  plan.param_dtype = param_dtype;
  plan.tf32 = args.tf32();
  const bool low_params = param_dtype == c10::kBFloat16 || param_dtype == c10::kHalf;
  const auto& masters = args.master_weights();

  if (low_params) {
    // The model's dtype decides the compute dtype; a contradicting flag is an error.
    TORCH_CHECK_VALUE(!(args.fp16() && param_dtype == c10::kBFloat16),
                      "the model's parameters are bf16 but --fp16 was given; use --bf16 (or load the model in fp32)");
    TORCH_CHECK_VALUE(!(args.bf16() && param_dtype == c10::kHalf),
                      "the model's parameters are fp16 but --bf16 was given; use --fp16 (or load the model in fp32)");
    plan.compute_dtype = param_dtype;
    plan.autocast = true;  // casts fp32 inputs to the model's dtype at matmuls and convs
    plan.master_weights = masters != "off";
    plan.pure_low_precision = !plan.master_weights;
    plan.loss_scaling = param_dtype == c10::kHalf;
    if (plan.loss_scaling && !args.dynamic_loss_scale()) plan.static_loss_scale = args.loss_scale();
    TORCH_CHECK_VALUE(!(plan.pure_low_precision && plan.loss_scaling),
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
  if (masters == "on") {
    // fp32 model, --bf16/--fp16 and master_weights=on: train low-precision parameters with
    // fp32 masters (half the weight memory of AMP's fp32 model in the forward pass).
    plan.param_dtype = plan.compute_dtype;
    plan.master_weights = true;
  }
  plan.autocast = true;
  return plan;
}

}  // namespace detail
}  // namespace mantissa
