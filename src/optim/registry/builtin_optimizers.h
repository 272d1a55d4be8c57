#pragma once
// The entries the registry starts with, one file each in this folder. Internal.

#include <vector>

#include <mantissa/optim/optimizer_registry.h>

namespace mantissa::optim::detail {

OptimizerSpec adamw_torch_spec();                ///< "adamw_torch": torch::optim::AdamW
std::vector<OptimizerSpec> fused_adamw_specs();  ///< "adamw_torch_fused", "adamw_mantissa_fused"
OptimizerSpec sgd_spec();                        ///< "sgd": torch::optim::SGD
OptimizerSpec adafactor_spec();                  ///< "adafactor": mantissa's Adafactor
OptimizerSpec adamw_8bit_spec();                 ///< "adamw_torch_8bit": mantissa's AdamW8bit
OptimizerSpec muon_spec();                       ///< "muon": mantissa's Muon (+ AdamW)
OptimizerSpec adam_torch_spec();  ///< torch::optim::Adam (set_optimizer_factory only)
OptimizerSpec adagrad_spec();     ///< torch::optim::Adagrad (set_optimizer_factory only)
OptimizerSpec rmsprop_spec();     ///< torch::optim::RMSprop (set_optimizer_factory only)
OptimizerSpec lbfgs_spec();       ///< torch::optim::LBFGS: recognised, never saved

/// Every built-in entry, the `--optim` names in HF's order first.
std::vector<OptimizerSpec> builtin_optimizers();

}  // namespace mantissa::optim::detail
