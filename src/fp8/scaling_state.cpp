#include <mantissa/fp8/scaling_state.h>

#include <cmath>
#include <limits>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <mantissa/fp8/cast.h>

#include "fp8/amax_record.h"
#include "value_checks.h"

namespace mantissa::fp8 {

namespace {

const char* const kRoleNames[kScalesPerLayer] = {"input", "weight", "grad_output"};

}  // namespace

Float8ScalingState::Float8ScalingState(Float8Recipe recipe, c10::Device device)
    : recipe_(std::move(recipe)) {
  recipe_.validate();
  TORCH_CHECK_VALUE(recipe_.recipe() == ScalingRecipe::kDelayed,
                    "a Float8ScalingState holds the delayed recipe's amax history; fp8_recipe='",
                    to_string(recipe_.recipe()), "' keeps no state");
  const auto options = at::TensorOptions().dtype(c10::kFloat).device(device);
  amax_history_ = at::zeros({recipe_.amax_history_len(), 0}, options);
  scale_ = at::ones({0}, options);
  scaled_max_ = at::ones({0}, options);
}

int64_t Float8ScalingState::add_layer(const std::string& name) {
  const int64_t first = num_scales();
  std::vector<float> maxima;
  for (int64_t role = 0; role < kScalesPerLayer; ++role) {
    names_.push_back(name + "." + kRoleNames[role]);
    const double max =
        float8_max(float8_dtype(recipe_.fp8_format(), static_cast<TensorRole>(role)));
    // TE's `fp8_max * 2^-margin` in float; a power of two times 448 or 57344 is exact.
    maxima.push_back(static_cast<float>(std::ldexp(max, -static_cast<int>(recipe_.margin()))));
  }
  const auto options = scale_.options();
  amax_history_ = at::cat(
      {amax_history_, at::zeros({recipe_.amax_history_len(), kScalesPerLayer}, options)}, 1);
  scale_ = at::cat({scale_, at::ones({kScalesPerLayer}, options)});
  scaled_max_ =
      at::cat({scaled_max_,
               at::tensor(maxima, at::TensorOptions().dtype(c10::kFloat)).to(options.device())});
  return first;
}

void Float8ScalingState::to_(c10::Device device) {
  if (device == scale_.device()) return;
  amax_history_ = amax_history_.to(device);
  scale_ = scale_.to(device);
  scaled_max_ = scaled_max_.to(device);
}

at::Tensor Float8ScalingState::scale(int64_t column) const {
  TORCH_CHECK_VALUE(column >= 0 && column < num_scales(), "FP8 scale column ", column,
                    " does not exist: the state has ", num_scales());
  return scale_.narrow(0, column, 1);
}

void Float8ScalingState::record_amax_(int64_t column, const at::Tensor& amax) {
  TORCH_CHECK_VALUE(column >= 0 && column < num_scales(), "FP8 amax column ", column,
                    " does not exist: the state has ", num_scales());
  detail::record_amax_(current_amaxes().narrow(0, column, 1), amax);
}

void Float8ScalingState::update_() {
  if (num_scales() == 0) return;
  const at::Tensor latest = amax_history_.select(0, 0);
  const double inf = std::numeric_limits<double>::infinity();
  // TE folds the window with fmaxf from 0: NaN entries drop out, inf stays.
  const at::Tensor window = recipe_.amax_compute_algo() == AmaxComputeAlgo::kMax
                                ? at::nan_to_num(amax_history_, 0.0, inf, -inf).amax(0)
                                : latest.clone();
  const at::Tensor usable = at::isfinite(window).logical_and_(window.gt(0));
  // One correctly rounded fp32 division per column, as `scaled_max / amax` in TE's kernel.
  scale_.copy_(at::where(usable, scaled_max_ / window, scale_));
  if (recipe_.amax_history_len() > 1) amax_history_.copy_(at::roll(amax_history_, -1, 0));
  amax_history_.select(0, 0).zero_();
}

torch::OrderedDict<std::string, at::Tensor> Float8ScalingState::state_dict() const {
  torch::OrderedDict<std::string, at::Tensor> state;
  state.insert("amax_history", amax_history_.cpu().clone());
  state.insert("scale", scale_.cpu().clone());
  return state;
}

void Float8ScalingState::load_state_dict(const torch::OrderedDict<std::string, at::Tensor>& state) {
  const std::pair<const char*, at::Tensor*> entries[] = {{"amax_history", &amax_history_},
                                                         {"scale", &scale_}};
  for (const auto& [key, target] : entries) {
    const at::Tensor* saved = state.find(key);
    TORCH_CHECK_VALUE(saved != nullptr, "the FP8 scaling state has no '", key, "' entry");
    TORCH_CHECK_VALUE(saved->scalar_type() == c10::kFloat && saved->sizes() == target->sizes(),
                      "the FP8 scaling state's '", key, "' is a ", saved->scalar_type(),
                      " tensor of shape ", saved->sizes(),
                      ", but this model's is a Float tensor of "
                      "shape ",
                      target->sizes(),
                      " ([fp8_amax_history_len, 3 per FP8 layer]): another model or another "
                      "fp8_amax_history_len");
  }
  // Values no run records. The history keeps NaN and inf (an overflowing step records them,
  // and update_() skips them); a zero, negative or non-finite scale would turn every cast by it
  // into zeros, NaN or inf.
  const auto columns = num_scales();
  const at::Tensor& scale = *state.find("scale");
  if (const auto bad = mantissa::detail::find_bad_values(
          scale, scale.isfinite().logical_not().logical_or_(scale.le(0)))) {
    TORCH_CHECK_VALUE(false, "the FP8 scaling state's 'scale' of '", names_[bad->first], "' is ",
                      bad->value, " (", bad->count, " of its ", columns,
                      " scales are not finite numbers > 0); a run resumed with it would cast to "
                      "zeros, NaN or inf");
  }
  const at::Tensor& history = *state.find("amax_history");
  if (const auto bad = mantissa::detail::find_bad_values(history, history.lt(0))) {
    TORCH_CHECK_VALUE(false, "the FP8 scaling state's 'amax_history' of '",
                      names_[bad->first % columns], "' is ", bad->value, " in row ",
                      bad->first / columns, " (", bad->count, " of its ", bad->numel,
                      " entries are negative); an amax is an absolute value");
  }
  amax_history_.copy_(*state.find("amax_history"));
  scale_.copy_(*state.find("scale"));
}

void all_reduce_amaxes_(Float8ScalingState& state, const AmaxAllReduce& all_reduce_max) {
  TORCH_CHECK_VALUE(static_cast<bool>(all_reduce_max), "all_reduce_amaxes_ needs a reduction");
  const at::Tensor current = state.current_amaxes();
  at::Tensor amaxes = current;
  all_reduce_max(amaxes);
  // A reduction that returns a new tensor instead of writing in place is written back.
  if (!amaxes.is_same(current)) current.copy_(amaxes);
}

void all_reduce_amaxes_(Float8ScalingState& state, c10d::ProcessGroup& group) {
  all_reduce_amaxes_(state, [&group](at::Tensor& amaxes) {
    std::vector<at::Tensor> tensors{amaxes};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MAX;
    group.allreduce(tensors, options)->wait();
  });
}

}  // namespace mantissa::fp8
