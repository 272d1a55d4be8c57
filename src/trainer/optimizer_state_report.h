#pragma once
// What the optimizer state of a run costs, counted from the tensors it holds: the line a run
// prints after its first update (the state of most optimizers only exists from then on).

#include <cstdint>
#include <optional>
#include <string>

#include <torch/optim/optimizer.h>

#include <mantissa/amp/master_weights.h>

namespace mantissa::detail {

/// The state an optimizer holds, in bytes, and the elements of the parameters it updates.
struct OptimizerStateSize {
  std::string optimizer;          ///< its registry name ("adafactor"), or its class's
  std::int64_t state_bytes = 0;   ///< every state tensor its registry entry lists
  std::int64_t parameters = 0;    ///< elements of the tensors it updates
  std::int64_t master_bytes = 0;  ///< fp32 master copies beside low-precision weights
};

/// Counts what `optimizer` holds now through its registry entry's `state_tensors` (0 bytes
/// before its first step), and what `masters` (may be null) add. Nullopt for an optimizer the
/// registry does not describe. No sync.
std::optional<OptimizerStateSize> measure_optimizer_state(const torch::optim::Optimizer& optimizer,
                                                          const amp::MasterWeights* masters);

/// A size as the run's log lines print it: "1.23 MiB", "12.0 KiB" or "640 bytes". Pure.
std::string bytes_text(std::int64_t bytes);

/// One line for the log: "mantissa: optimizer adafactor holds 1.23 MiB of state (4.00 bytes
/// per parameter, 322.0k parameters); fp32 masters 1.23 MiB more". Pure.
std::string describe_optimizer_state_size(const OptimizerStateSize& size);

}  // namespace mantissa::detail
