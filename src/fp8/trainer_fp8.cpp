#include "fp8/trainer_fp8.h"

#include <c10/util/Exception.h>

#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "io/torch_load.h"
#include "io/torch_save.h"
#include "shorten.h"
#include "trainer/checkpoint_files.h"

namespace mantissa::fp8 {
namespace {

constexpr const char* kFile = "fp8_state.pt";

c10::IValue state_value(const Float8ScalingState& state) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : state.state_dict()) dict.insert(item.key(), item.value());
  return dict;
}

void restore(const c10::IValue& value, Float8ScalingState& state) {
  TORCH_CHECK_VALUE(value.isGenericDict(), kFile, " does not hold a dict");
  torch::OrderedDict<std::string, at::Tensor> saved;
  for (const auto& entry : value.toGenericDict()) {
    TORCH_CHECK_VALUE(entry.key().isString() && entry.value().isTensor(), kFile,
                      " must map names to tensors");
    saved.insert(entry.key().toStringRef(), entry.value().toTensor());
  }
  state.load_state_dict(saved);
}

// A checkpoint without the file: lost, if its run kept one; otherwise this run switches the
// delayed recipe on (or back on) and its scales start afresh.
void load_missing(const std::string& dir) {
  const auto path = io::join_path(dir, kFile);
  const auto saved = detail::load_checkpoint_arguments(dir);
  const bool had_state = saved && saved->fp8() && saved->fp8_recipe() == ScalingRecipe::kDelayed;
  TORCH_CHECK(!had_state, "checkpoint file '", detail::shorten_path(path),
              "' is missing, but the checkpoint's training_args.json says its run used "
              "--fp8 with the delayed recipe, which saves its amax history and scales there");
  TORCH_WARN("the checkpoint '", detail::shorten_path(dir),
             "' has no fp8_state.pt (it was saved without the delayed FP8 recipe), so the FP8 "
             "scales start afresh at 1.0 and the amax history empty");
}

}  // namespace

detail::SavedState fp8_saved_state(Float8ScalingState& state) {
  detail::SavedState entry;
  entry.file = kFile;
  entry.save = [&state](const std::string& path) {
    const auto bytes = io::torch_save_bytes(state_value(state));
    io::write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
  };
  entry.load = [&state](const std::string& path) { restore(io::load_torch_file(path), state); };
  entry.load_missing = load_missing;
  // Every micro-batch of the group has recorded its amaxes into row 0 by now; a skipped step
  // updates too, so an overflow's inf amax leaves the scale as it was.
  entry.after_optimizer_step = [&state](const detail::StepServices& services) {
    all_reduce_amaxes_(state, services.max_all_reduce);
    state.update_();
  };
  return entry;
}

Float8Conversion convert_for_trainer(torch::nn::Module& module, const Float8Recipe& recipe,
                                     const Float8Filter& filter) {
  const bool own_filter = static_cast<bool>(filter);
  auto conversion =
      convert_to_float8_training(module, recipe, own_filter ? filter : default_float8_filter);
  TORCH_CHECK_VALUE(!conversion.float8_layers.empty(),
                    "--fp8: no layer of this model can run in FP8 (", conversion.describe(),
                    "). FP8 runs the matmuls of the model's mantissa::fp8::Float8Linear layers ",
                    own_filter ? "that the filter of set_float8_filter accepts"
                               : "other than its first and last linear layer, whose dimensions "
                                 "are multiples of 16",
                    "; declare such layers as Float8Linear (docs/fp8.md), or train without --fp8");
  return conversion;
}

detail::SavedStates TrainerFloat8Converter::convert(torch::nn::Module& module,
                                                    PrecisionPlan& plan) {
  auto conversion = convert_for_trainer(module, recipe_, filter_);
  plan.fp8_layers = conversion.describe();
  state_ = std::move(conversion.state);
  if (!state_) return {};
  return {fp8_saved_state(*state_)};
}

}  // namespace mantissa::fp8
