#pragma once
// FusedAdamW's low-precision update rules (Kahan compensation, stochastic rounding) applied to
// the fp32 result another optimizer computed, so that every optimizer that updates bf16/fp16
// parameters without masters rounds them alike: Adafactor and AdamW8bit write through it.
// Internal: src/optim only.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include <mantissa/optim/low_precision_update.h>

namespace mantissa::optim::detail {

/// What stochastic rounding's random bits of a tensor depend on, as FusedAdamW draws them:
/// `seed` (the optimizer's `stochastic_rounding_seed`, the Trainer's `seed`), the tensor's
/// index over all param groups and the parameter's step count after this update.
struct RoundingKey {
  std::uint64_t seed = 0;
  std::uint32_t tensor = 0;
  std::uint32_t step = 0;
};

/// Writes the fp32 `target` (the update's result, `param`'s shape) into the bf16/fp16 `param`
/// under `rule`: `kNearest` casts; `kKahan` adds the part lost to rounding to `comp` (the
/// parameter's dtype and shape, updated in place; made as zeros on the first Kahan write when
/// undefined, so an optimizer passes its state's buffer) and feeds it into this write; and
/// `kStochasticRounding` rounds each element up or down with the bits FusedAdamW would draw for
/// it under `key`. Element for element the same results as FusedAdamW's kernels, on the CPU
/// and, in a kernel of its own (low_precision_write_cuda.cu), on a GPU of a CUDA build; another
/// device goes through the host (a sync, warned about once, naming `optimizer`). No sync.
void write_low_precision_(const at::Tensor& param, const at::Tensor& target,
                          LowPrecisionUpdate rule, at::Tensor& comp, const RoundingKey& key,
                          const char* optimizer);

}  // namespace mantissa::optim::detail
