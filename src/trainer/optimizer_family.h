#pragma once
// Whether an optimizer.pt was saved by an optimizer of the family that is to load it, asked
// before LibTorch reads it: LibTorch's loaders assume their own keys and stop on an internal
// assertion ("is_tensor_type INTERNAL ASSERT FAILED at .../optim/sgd.cpp") when they are not
// there.

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>

namespace mantissa::detail {

/// Throws a c10::ValueError naming both optimizers and their option names when the parameter
/// group options saved in `archive` (an optimizer.pt loaded with io::load_torch_archive) belong
/// to another family than `optimizer`'s, the families being those of the optimizer registry
/// (built in: SGD, Adam/AdamW with FusedAdamW, which reads AdamW's state, RMSprop, Adagrad,
/// LBFGS). An archive without parameter groups passes (the
/// load itself then decides). Python's `optimizer.load_state_dict` has no such check; it fails
/// on the first missing key. No device sync.
void check_optimizer_family(torch::optim::Optimizer& optimizer,
                            torch::serialize::InputArchive& archive);

}  // namespace mantissa::detail
