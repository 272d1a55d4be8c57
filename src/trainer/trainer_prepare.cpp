// Trainer::Impl::prepare(): the objects an update needs, made once from the model and the
// arguments (the model cast, moved, converted and handed to the strategy; gradient
// checkpointing switched on; scaler, masters, optimizer and scheduler).
#include <limits>

#include <mantissa/nn/supports_gradient_checkpointing.h>

#include "trainer/precision_plan.h"
#include "trainer/trainer_impl.h"
#include "training_arguments/fsdp_checks.h"

namespace mantissa {

void Trainer::Impl::prepare() {
  if (prepared()) return;
  auto& o = objects_;
  o.schedule = detail::make_run_schedule(
      static_cast<std::size_t>(strategy_->examples_per_process(
          static_cast<std::int64_t>(train_.size), args_.dataloader_drop_last())),
      args_);
  if (plan_.param_dtype != detail::floating_param_dtype(*module_)) module_->to(plan_.param_dtype);
  module_->to(device_);
  // On the device, so that the converters' state is made there.
  for (auto& converter : converters_) {
    for (auto& piece : converter->convert(*module_, plan_)) {
      objects_.saved_states.push_back(std::move(piece));
    }
  }
  // fsdp_config's activation_checkpointing is the same recompute, asked through FSDP.
  const auto fsdp = detail::read_fsdp_settings(args_.fsdp(), args_.fsdp_config());
  if (args_.gradient_checkpointing() || (fsdp.enabled && fsdp.activation_checkpointing)) {
    enable_gradient_checkpointing();
  }
  // Before the fp32 masters copy the weights: among several processes they are rank 0's now.
  strategy_->prepare_model(*module_);
  // Before the optimizer: a sharded strategy tells it how to agree on inf/nan.
  o.scaler = amp::GradScaler(
      amp::GradScalerOptions()
          .enabled(plan_.loss_scaling)
          .init_scale(args_.init_loss_scale())
          .growth_interval(args_.loss_scale_window())
          .hysteresis(args_.hysteresis())
          .consecutive_hysteresis(args_.consecutive_hysteresis())
          .min_scale(args_.min_loss_scale())
          .max_scale(args_.max_loss_scale().value_or(std::numeric_limits<double>::infinity())));
  // The strategy chooses the tensors (a sharded one its shards), the registry or the user's
  // factory builds the optimizer over them, and the strategy sets it up.
  if (hooks_.optimizer_factory) {
    if (const auto why = strategy_->optimizer_factory_blocker()) {
      TORCH_CHECK_VALUE(false, "set_optimizer_factory: ", *why);
    }
  }
  const auto params = strategy_->optimizer_params(*module_);
  detail::OptimizerSetup setup;
  if (plan_.weights == WeightsMode::kFp32Masters) {
    setup.masters = std::make_unique<amp::MasterWeights>(params.in_order);
  }
  setup.optimizer = detail::make_trainer_optimizer(
      args_, params, setup.masters.get(), plan_.low_precision_update, hooks_.optimizer_factory);
  strategy_->setup_optimizer(setup, plan_, o.scaler);
  o.masters = std::move(setup.masters);
  o.optimizer = std::move(setup.optimizer);
  if (hooks_.optimizer_factory) {
    // A user's optimizer writes low-precision weights its own way.
    const auto& groups = o.optimizer.optimizer->param_groups();
    plan_.low_precision_update =
        o.optimizer.fused != nullptr
            ? static_cast<const optim::FusedAdamWOptions&>(groups.front().options())
                  .low_precision_update()
            : optim::LowPrecisionUpdate::kNearest;
  }
  if (plan_.weights == WeightsMode::kPureLowPrecision &&
      plan_.low_precision_update == optim::LowPrecisionUpdate::kNearest) {
    amp::warn_pure_low_precision_once(plan_.param_dtype);
  }
  auto& optimizer = *o.optimizer.optimizer;
  const auto max_steps = o.schedule.max_steps;
  auto scheduler = hooks_.scheduler_factory
                       ? hooks_.scheduler_factory(optimizer, max_steps)
                       : std::make_unique<LrScheduler>(optimizer, args_.lr_scheduler_type().value(),
                                                       args_.get_warmup_steps(max_steps), max_steps,
                                                       args_.lr_scheduler_kwargs());
  TORCH_CHECK_VALUE(scheduler != nullptr, "the scheduler factory returned null");
  o.scheduler = std::move(scheduler);  // last: it marks the Trainer prepared
  update_callback_context();
}

void Trainer::Impl::enable_gradient_checkpointing() {
  auto* model = dynamic_cast<nn::SupportsGradientCheckpointing*>(module_.get());
  TORCH_CHECK_VALUE(model != nullptr, "--gradient_checkpointing: ", module_->name(),
                    " does not support gradient checkpointing: its class must derive from "
                    "mantissa::nn::SupportsGradientCheckpointing and run its blocks through "
                    "maybe_checkpoint (docs/trainer.md, \"Saving memory\"); or train without "
                    "--gradient_checkpointing");
  if (const auto why = strategy_->gradient_checkpointing_blocker()) {
    TORCH_CHECK_VALUE(false, "--gradient_checkpointing ", *why);
  }
  model->gradient_checkpointing_enable(
      args_.gradient_checkpointing_kwargs().value_or(GradientCheckpointingKwargs{}));
}

}  // namespace mantissa
