#pragma once

#include <cstdint>

namespace mantissa {

/// Seeds every random generator a training program draws from: LibTorch's CPU generator and
/// those of all CUDA devices (`torch::manual_seed`), and C's `rand`. With `deterministic`,
/// LibTorch also switches to deterministic algorithms and raises for an operation that has
/// none. Python: `transformers.set_seed(seed, deterministic)`.
///
/// Call it before building the model: a model's initial weights come from these generators
/// when its constructor runs, so they are the program's to seed; `Trainer::train()` seeds
/// again with `--seed` (for dropout and the data order), which does not touch weights that
/// already exist. No device sync.
void set_seed(std::uint64_t seed, bool deterministic = false);

}  // namespace mantissa
