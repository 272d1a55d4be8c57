#pragma once

/// The umbrella header: everything mantissa offers. Include the single headers instead to
/// keep compile times down.
#include <mantissa/amp/autocast.h>
#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/amp/supports_amp_scaling.h>
#include <mantissa/amp/tf32_guard.h>
#include <mantissa/amp/unscale.h>
#include <mantissa/arg.h>
#include <mantissa/argument_enums.h>
#include <mantissa/batch.h>
#include <mantissa/choice.h>
#include <mantissa/clip_grad.h>
#include <mantissa/distributed.h>
#include <mantissa/distributed_backend.h>
#include <mantissa/fp8/cast.h>
#include <mantissa/fp8/convert.h>
#include <mantissa/fp8/float8_linear.h>
#include <mantissa/fp8/recipe.h>
#include <mantissa/fp8/scaling_state.h>
#include <mantissa/io/safetensors.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/lr_scheduler_kwargs.h>
#include <mantissa/model_forward.h>
#include <mantissa/model_output.h>
#include <mantissa/nn/multihead_attention.h>
#include <mantissa/optim/fused_adamw.h>
#include <mantissa/optim/low_precision_update.h>
#include <mantissa/precision_plan.h>
#include <mantissa/seed.h>
#include <mantissa/tensorboard_callback.h>
#include <mantissa/trainer.h>
#include <mantissa/trainer_callback.h>
#include <mantissa/trainer_hooks.h>
#include <mantissa/training_arguments.h>
#include <mantissa/version.h>
