#pragma once
// Which modules of a model become the units of a fully sharded run: the auto-wrap policy of
// HF's fsdp_config (accelerate's `fsdp2_prepare_auto_wrap_policy`), over the C++ module tree.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "training_arguments/fsdp_checks.h"

namespace mantissa::detail::sharded {

/// A block that becomes a sharding unit.
struct BlockUnit {
  std::string name;                            ///< its dotted path in the model ("layers.3")
  std::string class_name;                      ///< its `Module::name()`
  const torch::nn::Module* module = nullptr;  ///< the block itself
};

/// Whether `module_name` (a `Module::name()`, maybe with a namespace) is the class `wanted`
/// (with or without the namespace).
bool is_block_class(const std::string& module_name, const std::string& wanted);

/// The blocks of `model` that `settings` make units, in the order of the module tree (pre-order;
/// the descendants of a block are not searched): TRANSFORMER_BASED_WRAP takes the modules whose
/// class is in `transformer_layer_cls_to_wrap`, or in `declared` (the model's
/// `no_split_modules()`) when that is unset; SIZE_BASED_WRAP the modules of the `declared`
/// classes with at least `min_num_params` parameters (none when it is 0); NO_WRAP none. Throws
/// `c10::ValueError` naming a class of `transformer_layer_cls_to_wrap` that no module has (and
/// the classes the model does have), and naming two blocks that share a parameter. Pure: reads
/// the module tree.
std::vector<BlockUnit> find_block_units(const torch::nn::Module& model,
                                        const FsdpSettings& settings,
                                        const std::vector<std::string>& declared);

}  // namespace mantissa::detail::sharded
