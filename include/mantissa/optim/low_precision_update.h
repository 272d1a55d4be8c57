#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include <mantissa/choice.h>

namespace mantissa::optim {

/// How an optimizer writes its fp32 result into a bfloat16/float16 parameter that has no fp32
/// master copy (pure low-precision training). fp32 and fp64 parameters, and fp32 masters, are
/// unaffected: their results are stored as they are.
///
/// - `kNearest`: round to the nearest representable value (PyTorch's `p.add_()` on a bf16
///   tensor). An update smaller than half a unit in the last place of the weight is lost:
///   for bf16, whenever it is below about 1/256 of the weight.
/// - `kKahan`: keep a compensation buffer in the parameter's dtype that holds the part of each
///   update the rounding lost, and add it to the next update (Kahan summation). Python: optimi's
///   `AdamW(kahan_sum=True)`.
/// - `kStochasticRounding`: round up or down at random, with the probability of rounding up equal
///   to the discarded fraction of a unit in the last place, so the stored value is right on
///   average. Python: torchao's `_AdamW(bf16_stochastic_round=True)`.
enum class LowPrecisionUpdate : std::int8_t { kNearest, kKahan, kStochasticRounding };

}  // namespace mantissa::optim

namespace mantissa {

/// The spellings of `optim::LowPrecisionUpdate`, so that `Choice<optim::LowPrecisionUpdate>` reads
/// and writes them.
template <>
struct ChoiceTraits<optim::LowPrecisionUpdate> {
  static constexpr const char* enum_name = "LowPrecisionUpdate";
  static constexpr const char* names[] = {"nearest", "kahan", "stochastic_rounding"};
};

static_assert(Choice<optim::LowPrecisionUpdate>::size() ==
              static_cast<int>(optim::LowPrecisionUpdate::kStochasticRounding) + 1);

}  // namespace mantissa

namespace mantissa::optim {

/// The option's spelling at the edge (CLI, JSON, checkpoints): "nearest", "kahan",
/// "stochastic_rounding". Pure.
inline const char* to_string(LowPrecisionUpdate rule) {
  return Choice<LowPrecisionUpdate>::name_at(static_cast<std::size_t>(rule));
}

/// Reads a spelling of `to_string` through `Choice<LowPrecisionUpdate>`. Throws
/// `c10::ValueError` naming the option and the text otherwise, in the Python package's words
/// ("low_precision_update must be nearest, kahan or stochastic_rounding; got 'sr'"). Pure.
inline LowPrecisionUpdate parse_low_precision_update(std::string_view text) {
  using Rule = Choice<LowPrecisionUpdate>;
  const Rule rule(text);
  if (!rule.is_valid()) {
    std::string names;
    for (std::size_t i = 0; i < Rule::size(); ++i) {
      names += i == 0 ? "" : i + 1 == Rule::size() ? " or " : ", ";
      names += Rule::name_at(i);
    }
    TORCH_CHECK_VALUE(false, "low_precision_update must be ", names, "; got '", text, "'");
  }
  return rule.value();
}

/// Mixin for an optimizer that computes its update in fp32 and writes bf16/fp16 parameters
/// without masters by a `LowPrecisionUpdate` rule (`Adafactor`, `AdamW8bit`; FusedAdamW keeps
/// the rule in its options). The rule is not saved with the optimizer: the run sets it (the
/// Trainer from `low_precision_update` and `seed`). Host only.
class LowPrecisionRules {
 public:
  /// How bf16/fp16 parameters receive their fp32 result (`kNearest` until set), and the key of
  /// stochastic rounding's bits.
  void set_low_precision_update(LowPrecisionUpdate rule, std::uint64_t stochastic_rounding_seed) {
    low_precision_update_ = rule;
    stochastic_rounding_seed_ = stochastic_rounding_seed;
  }
  LowPrecisionUpdate low_precision_update() const noexcept { return low_precision_update_; }
  std::uint64_t stochastic_rounding_seed() const noexcept { return stochastic_rounding_seed_; }
  /// The index, per tensor of the param groups in order, by which stochastic rounding keys its
  /// bits (empty, the default: each tensor's own position over the groups, as FusedAdamW keys
  /// them). A process that updates a share of the model's tensors (`--fsdp shard_grad_op` by
  /// whole tensors) gives each tensor its position in the whole model's optimizer, so that its
  /// draws are those of a run over the whole model.
  void set_rounding_indices(std::vector<std::uint32_t> indices) {
    rounding_indices_ = std::move(indices);
  }
  /// The key index of the tensor at `position` over the param groups.
  std::uint32_t rounding_index(std::uint32_t position) const noexcept {
    return position < rounding_indices_.size() ? rounding_indices_[position] : position;
  }

 protected:
  ~LowPrecisionRules() = default;

 private:
  LowPrecisionUpdate low_precision_update_ = LowPrecisionUpdate::kNearest;
  std::uint64_t stochastic_rounding_seed_ = 0;
  std::vector<std::uint32_t> rounding_indices_;
};

}  // namespace mantissa::optim
