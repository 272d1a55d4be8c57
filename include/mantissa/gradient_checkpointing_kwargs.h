#pragma once
// The keyword arguments of gradient checkpointing (`gradient_checkpointing_kwargs`).

#include <optional>

namespace mantissa {

/// `TrainingArguments::gradient_checkpointing_kwargs`: what HF's Trainer passes to
/// `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)`, which hands it on
/// to `torch.utils.checkpoint.checkpoint`. Python: a dict such as `{"use_reentrant": False}`;
/// on the command line and in training_args.json a JSON object of the keys below. Any other
/// key is refused by name. A plain host value.
struct GradientCheckpointingKwargs {
  /// PyTorch's `use_reentrant`. Accepted and passed to the model, which may read it;
  /// `mantissa::nn::checkpoint` has one implementation either way (a recompute inside the
  /// backward, as the reentrant variant, that also gives the parameters of the function their
  /// gradients when no input requires grad, as the non-reentrant one). Unset: not given.
  std::optional<bool> use_reentrant;
  /// PyTorch's `preserve_rng_state`: whether the recompute replays the forward's CPU and CUDA
  /// random numbers (dropout masks). Unset: true, PyTorch's default.
  std::optional<bool> preserve_rng_state;

  /// Key-by-key equality.
  bool operator==(const GradientCheckpointingKwargs& other) const {
    return use_reentrant == other.use_reentrant && preserve_rng_state == other.preserve_rng_state;
  }
  /// Negation of `operator==`.
  bool operator!=(const GradientCheckpointingKwargs& other) const { return !(*this == other); }
};

}  // namespace mantissa
