#include <mantissa/seed.h>

#include <cstdlib>

#include <ATen/Context.h>
#include <torch/utils.h>

namespace mantissa {

void set_seed(std::uint64_t seed, bool deterministic) {
  torch::manual_seed(seed);
  std::srand(static_cast<unsigned>(seed));
  if (deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
}

}  // namespace mantissa
