// torch::optim::LBFGS: its optimizer.pt files are recognised (to name them in an error), but
// checkpoints cannot hold its state (no state_tensors).
#include <torch/optim/lbfgs.h>

#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {

OptimizerSpec lbfgs_spec() {
  OptimizerSpec spec;
  spec.type = typeid(torch::optim::LBFGS);
  spec.family = "LBFGS";
  spec.family_marks = {"max_iter", "history_size"};
  return spec;
}

}  // namespace mantissa::optim::detail
