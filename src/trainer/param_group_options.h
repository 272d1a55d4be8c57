#pragma once
// The options of an optimizer's param groups (betas, eps, weight decay, the learning rate...)
// apart from its state: what a resume restores from the checkpoint, as optimizer.pt's
// "param_groups" does for a data-parallel run, where a sharded run keeps its state elsewhere.

#include <string>

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

namespace mantissa::detail {

/// Every param group's options of `optimizer` as the bytes of a LibTorch archive (each group's
/// options as its `serialize` writes them). Python: the `param_groups` of
/// `optimizer.state_dict()` without "params". Host-side; no sync.
std::string param_group_options_bytes(const torch::optim::Optimizer& optimizer);

/// Sets each param group's options of `optimizer` from `param_group_options_bytes` of an
/// optimizer of the same kind with as many groups; `origin` (a file, a rank) is named in the
/// errors. Python: the options half of `load_state_dict`. No sync. For bytes this run made
/// (another rank's); a file goes through `io::load_torch_archive` and the overload below.
void load_param_group_options(torch::optim::Optimizer& optimizer, const std::string& bytes,
                              const std::string& origin);
/// The same from an archive already read (a file, through the bounds-checked
/// `io::load_torch_archive`).
void load_param_group_options(torch::optim::Optimizer& optimizer,
                              torch::serialize::InputArchive& archive, const std::string& origin);

/// Copies each param group's options of `from` into the same group of `to`, an optimizer of the
/// same kind with as many groups. No sync.
void copy_param_group_options(const torch::optim::Optimizer& from, torch::optim::Optimizer& to);

}  // namespace mantissa::detail
