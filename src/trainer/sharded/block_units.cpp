#include "trainer/sharded/block_units.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include <c10/util/Exception.h>

namespace mantissa::detail::sharded {
namespace {

std::int64_t parameter_count(const torch::nn::Module& module) {
  std::int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

bool matches_any(const std::string& module_name, const std::vector<std::string>& classes) {
  return std::any_of(classes.begin(), classes.end(), [&](const std::string& wanted) {
    return is_block_class(module_name, wanted);
  });
}

// Pre-order walk; a module that `take` accepts is collected and its descendants skipped.
template <class Take>
void collect(const torch::nn::Module& module, const std::string& prefix, const Take& take,
             std::vector<BlockUnit>& out) {
  for (const auto& child : module.named_children()) {
    const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
    const auto& block = *child.value();
    if (take(block)) {
      out.push_back(BlockUnit{name, block.name(), &block});
    } else {
      collect(block, name, take, out);
    }
  }
}

}  // namespace

bool is_block_class(const std::string& module_name, const std::string& wanted) {
  if (module_name == wanted) return true;
  const auto colons = module_name.rfind("::");
  return colons != std::string::npos && module_name.compare(colons + 2, std::string::npos,
                                                            wanted) == 0;
}

std::vector<BlockUnit> find_block_units(const torch::nn::Module& model,
                                        const FsdpSettings& settings,
                                        const std::vector<std::string>& declared) {
  std::vector<BlockUnit> blocks;
  switch (settings.auto_wrap_policy) {
    case FsdpAutoWrap::kNoWrap:
      return blocks;
    case FsdpAutoWrap::kSizeBased: {
      if (settings.min_num_params == 0) return blocks;  // accelerate wraps nothing at 0
      collect(
          model, "",
          [&](const torch::nn::Module& m) {
            return matches_any(m.name(), declared) && parameter_count(m) >= settings.min_num_params;
          },
          blocks);
      break;
    }
    case FsdpAutoWrap::kTransformerBased: {
      const auto& classes = settings.transformer_layer_cls_to_wrap.value_or(declared);
      collect(
          model, "", [&](const torch::nn::Module& m) { return matches_any(m.name(), classes); },
          blocks);
      if (settings.transformer_layer_cls_to_wrap) {
        for (const auto& wanted : classes) {
          const bool found = std::any_of(blocks.begin(), blocks.end(), [&](const BlockUnit& b) {
            return is_block_class(b.class_name, wanted);
          });
          if (found) continue;
          std::set<std::string> present;
          for (const auto& m : model.modules(/*include_self=*/false)) present.insert(m->name());
          std::string listed;
          for (const auto& name : present) listed += (listed.empty() ? "" : ", ") + name;
          TORCH_CHECK_VALUE(false, "fsdp_config: transformer_layer_cls_to_wrap names '", wanted,
                            "', but no module of ", model.name(),
                            " has that class; its modules' classes are: ", listed);
        }
      }
      break;
    }
  }
  std::unordered_map<const c10::TensorImpl*, std::size_t> owner;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    for (const auto& p : blocks[b].module->parameters()) {
      const auto [at, fresh] = owner.emplace(p.unsafeGetTensorImpl(), b);
      TORCH_CHECK_VALUE(fresh, "fsdp: the blocks ", blocks[at->second].name, " and ",
                        blocks[b].name,
                        " share a parameter (a tied weight); a parameter can belong to one "
                        "sharding unit only: leave one of their classes out of "
                        "transformer_layer_cls_to_wrap");
    }
  }
  return blocks;
}

}  // namespace mantissa::detail::sharded
