// GradScaler: torch/amp/grad_scaler.py, method for method. Comments name the Python lines
// where the C++ has to do something the Python gets for free.
#include <mantissa/amp/grad_scaler.h>

#include <cmath>
#include <map>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/serialize.h>

#include <mantissa/amp/supports_amp_scaling.h>
#include <mantissa/amp/unscale.h>

#include "cuda_capture.h"
#include "io/atomic_file.h"
#include "io/torch_load.h"
#include "io/torch_save.h"

namespace mantissa::amp {
namespace {

// Adds the found-inf flag of each device in `per_device` into `sum` (undefined: none yet),
// moved to `device` without a host sync.
void add_found_inf(const std::vector<std::pair<c10::Device, at::Tensor>>& per_device,
                   const c10::Device& device, at::Tensor& sum) {
  for (const auto& [flag_device, flag] : per_device) {
    auto here = flag.to(device, /*non_blocking=*/true);
    sum = sum.defined() ? sum + here : here;
  }
}

constexpr const char* kScaleFix =
    "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the "
    "iteration.";

void check_growth_factor(double factor) {
  TORCH_CHECK_VALUE(factor > 1.0, "The growth factor must be > 1.0. Got growth_factor=", factor);
}
void check_backoff_factor(double factor) {
  TORCH_CHECK_VALUE(factor < 1.0 && factor > 0.0,
                    "The backoff factor must be < 1.0 (and > 0). Got backoff_factor=", factor);
}
void check_growth_interval(std::int64_t interval) {
  TORCH_CHECK_VALUE(interval >= 1,
                    "The growth interval must be >= 1. Got growth_interval=", interval);
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : options_(std::move(options)), init_hysteresis_tracker_(options_.hysteresis()) {
  if (options_.enabled()) {
    check_growth_factor(options_.growth_factor());
    check_backoff_factor(options_.backoff_factor());
    check_growth_interval(options_.growth_interval());
    TORCH_CHECK_VALUE(
        std::isfinite(options_.init_scale()) && options_.init_scale() > 0,
        "init_scale must be a finite positive number. Got init_scale=", options_.init_scale());
    TORCH_CHECK_VALUE(options_.hysteresis() >= 1,
                      "hysteresis must be >= 1. Got hysteresis=", options_.hysteresis());
    TORCH_CHECK_VALUE(options_.min_scale() >= 0,
                      "min_scale must be >= 0. Got min_scale=", options_.min_scale());
    TORCH_CHECK_VALUE(options_.max_scale() >= options_.min_scale(),
                      "max_scale must be >= min_scale. Got max_scale=", options_.max_scale(),
                      ", min_scale=", options_.min_scale());
    TORCH_CHECK_VALUE(
        options_.init_scale() >= options_.min_scale() &&
            options_.init_scale() <= options_.max_scale(),
        "init_scale must lie in [min_scale, max_scale]. Got init_scale=", options_.init_scale(),
        ", min_scale=", options_.min_scale(), ", max_scale=", options_.max_scale());
  }
}

GradScaler::GradScaler(GradScaler&&) noexcept = default;
GradScaler& GradScaler::operator=(GradScaler&&) noexcept = default;
GradScaler::~GradScaler() = default;

bool GradScaler::extensions_enabled() const noexcept {
  return options_.hysteresis() > 1 || options_.min_scale() > 0 ||
         std::isfinite(options_.max_scale());
}

void GradScaler::lazy_init_scale_growth_tracker(const c10::Device& device) {
  TORCH_INTERNAL_ASSERT(!growth_tracker_.defined(), "_growth_tracker initialized before _scale");
  const auto on = at::TensorOptions().device(device);
  scale_ = at::full({}, options_.init_scale(), on.dtype(at::kFloat));
  growth_tracker_ = at::full({}, init_growth_tracker_, on.dtype(at::kInt));
  skipped_steps_ = at::zeros({}, on.dtype(at::kLong));
  if (extensions_enabled()) {
    hysteresis_tracker_ = at::full({}, init_hysteresis_tracker_, on.dtype(at::kInt));
  }
}

std::pair<const at::Tensor&, const at::Tensor&> GradScaler::check_scale_growth_tracker(
    const char* funcname) const {
  TORCH_CHECK(scale_.defined(), "Attempted ", funcname, " but _scale is None.  ", kScaleFix);
  TORCH_CHECK(growth_tracker_.defined(), "Attempted ", funcname, " but _growth_tracker is None.  ",
              kScaleFix);
  return {scale_, growth_tracker_};
}

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!options_.enabled()) return outputs;
  if (!scale_.defined()) {
    TORCH_CHECK(!mantissa::detail::is_capturing_on(outputs.device()),
                "GradScaler: the first scale() is being captured in a CUDA graph, where making the "
                "scale would run "
                "again (resetting it) on every replay. Run an eager step first.");
    lazy_init_scale_growth_tracker(outputs.device());
  }
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> scaled;
  scaled.reserve(outputs.size());
  // Python keeps one copy of the scale per device (_MultiDeviceReplicator); `scale(tensor)`
  // with its non-blocking `.to()` is the same thing per element.
  for (const auto& output : outputs) scaled.push_back(scale(output));
  return scaled;
}

std::vector<std::pair<c10::Device, at::Tensor>> GradScaler::unscale_grads(
    torch::optim::Optimizer& optimizer, const at::Tensor& inv_scale, const at::Tensor& found_inf,
    bool allow_fp16) const {
  // _MultiDeviceReplicator: one copy of inv_scale and found_inf per device, made on demand.
  std::vector<std::pair<c10::Device, at::Tensor>> per_device_found_inf;
  std::vector<std::pair<c10::Device, at::Tensor>> per_device_inv_scale;
  auto replica = [](std::vector<std::pair<c10::Device, at::Tensor>>& replicas,
                    const at::Tensor& master, const c10::Device& device) -> at::Tensor& {
    for (auto& [d, t] : replicas) {
      if (d == device) return t;
    }
    replicas.emplace_back(device, master.to(device, /*non_blocking=*/true, /*copy=*/false));
    return replicas.back().second;
  };

  // Grouped by device, then dtype, in order of first appearance (Python's defaultdicts).
  std::vector<
      std::pair<c10::Device, std::vector<std::pair<c10::ScalarType, std::vector<at::Tensor>>>>>
      groups;
  at::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      auto& grad = param.mutable_grad();
      TORCH_CHECK_VALUE(allow_fp16 || grad.scalar_type() != at::kHalf,
                        "Attempting to unscale FP16 gradients.");
      at::Tensor to_unscale;
      if (grad.is_sparse()) {
        if (grad.scalar_type() == at::kHalf) grad = grad.coalesce();
        to_unscale = grad._values();
      } else {
        to_unscale = grad;
      }
      auto device_it = std::find_if(groups.begin(), groups.end(),
                                    [&](const auto& g) { return g.first == to_unscale.device(); });
      if (device_it == groups.end()) {
        groups.push_back({to_unscale.device(), {}});
        device_it = std::prev(groups.end());
      }
      auto& per_dtype = device_it->second;
      auto dtype_it = std::find_if(per_dtype.begin(), per_dtype.end(), [&](const auto& g) {
        return g.first == to_unscale.scalar_type();
      });
      if (dtype_it == per_dtype.end()) {
        per_dtype.push_back({to_unscale.scalar_type(), {}});
        dtype_it = std::prev(per_dtype.end());
      }
      dtype_it->second.push_back(to_unscale);
    }
  }
  for (auto& [device, per_dtype] : groups) {
    auto& device_found_inf = replica(per_device_found_inf, found_inf, device);
    const auto& device_inv_scale = replica(per_device_inv_scale, inv_scale, device);
    for (auto& [dtype, grads] : per_dtype) {
      non_finite_check_and_unscale_(grads, device_found_inf, device_inv_scale);
    }
  }
  return per_device_found_inf;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  check_scale_growth_tracker("unscale_");
  auto& state = per_optimizer_states_[&optimizer];
  TORCH_CHECK(state.stage != Stage::kUnscaled,
              "unscale_() has already been called on this optimizer since the last update().");
  TORCH_CHECK(state.stage != Stage::kStepped, "unscale_() is being called after step().");

  // FP32 division can be imprecise for certain compile options, so we carry out the
  // reciprocal in FP64 (Python's comment and arithmetic).
  const auto inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  const auto found_inf = at::full({}, 0.0, scale_.options().dtype(at::kFloat));
  state.found_inf_per_device = unscale_grads(optimizer, inv_scale, found_inf, /*allow_fp16=*/false);
  reduce_found_inf(state.found_inf_per_device);
  state.stage = Stage::kUnscaled;
}

void GradScaler::check_inf_per_device(torch::optim::Optimizer& optimizer) {
  const auto& scale = check_scale_growth_tracker("_check_inf_per_device").first;
  const auto dummy_inv_scale = at::full({}, 1.0, scale.options().dtype(at::kFloat));
  const auto found_inf = at::full({}, 0.0, scale.options().dtype(at::kFloat));
  auto& flags = per_optimizer_states_[&optimizer].found_inf_per_device;
  flags = unscale_grads(optimizer, dummy_inv_scale, found_inf, /*allow_fp16=*/true);
  reduce_found_inf(flags);
}

void GradScaler::reduce_found_inf(
    std::vector<std::pair<c10::Device, at::Tensor>>& per_device) const {
  if (!found_inf_reduction_) return;
  // The reduction is a collective: a process whose optimizer saw no gradient (it owns no tensor
  // that had one this step) still takes part, with a flag of 0 on the scale's device.
  if (per_device.empty()) {
    per_device.emplace_back(scale_.device(), at::zeros({}, scale_.options().dtype(at::kFloat)));
  }
  for (auto& [device, flag] : per_device) found_inf_reduction_(flag);
}

void GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return;
  }
  check_scale_growth_tracker("step");
  auto& state = per_optimizer_states_[&optimizer];
  TORCH_CHECK(state.stage != Stage::kStepped,
              "step() has already been called since the last update().");

  if (auto* fused = dynamic_cast<SupportsAmpScaling*>(&optimizer)) {
    // The optimizer unscales and checks for inf itself, on the device: no sync.
    if (state.stage == Stage::kReady) check_inf_per_device(optimizer);
    at::Tensor found_inf;
    add_found_inf(state.found_inf_per_device, scale_.device(), found_inf);
    if (!found_inf.defined()) found_inf = at::zeros({}, scale_.options().dtype(at::kFloat));
    const at::Tensor grad_scale = state.stage == Stage::kUnscaled ? at::Tensor() : scale_;
    fused->set_amp_scaling(grad_scale, found_inf);
    try {
      optimizer.step();
    } catch (...) {
      fused->clear_amp_scaling();
      throw;
    }
    fused->clear_amp_scaling();
    state.stage = Stage::kStepped;
    return;
  }

  if (state.stage == Stage::kReady) unscale_(optimizer);
  TORCH_CHECK(!state.found_inf_per_device.empty(),
              "No inf checks were recorded for this optimizer.");
  // _maybe_opt_step: the one host sync of a non-fused step.
  double found = 0.0;
  for (const auto& [device, flag] : state.found_inf_per_device) found += flag.item<double>();
  if (found == 0.0) optimizer.step();
  state.stage = Stage::kStepped;
}

void GradScaler::step(torch::optim::Optimizer& optimizer,
                      const torch::optim::Optimizer::LossClosure& closure) {
  if (!options_.enabled()) {
    optimizer.step(closure);
    return;
  }
  TORCH_CHECK(!closure, "Closure use is not currently supported if GradScaler is enabled.");
  step(optimizer);
}

at::Tensor GradScaler::combined_found_inf() const {
  at::Tensor combined;
  for (const auto& [optimizer, state] : per_optimizer_states_) {
    add_found_inf(state.found_inf_per_device, scale_.device(), combined);
  }
  return combined;
}

void GradScaler::finish_update(const at::Tensor& found_inf) {
  if (found_inf.defined()) {
    skipped_steps_.add_(found_inf.gt(0));
    // In place once it exists, so that a step captured in a CUDA graph keeps updating the
    // tensor `last_step_skipped()` reads.
    if (last_found_inf_.defined() && last_found_inf_.device() == found_inf.device()) {
      last_found_inf_.copy_(found_inf.reshape({}));
    } else {
      last_found_inf_ = found_inf.reshape({}).to(at::kFloat).clone();
    }
  }
  per_optimizer_states_.clear();
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  check_scale_growth_tracker("update");
  auto found_inf = combined_found_inf();
  TORCH_CHECK(found_inf.defined(), "No inf checks were recorded prior to update.");
  if (extensions_enabled()) {
    update_with_extensions(found_inf);
  } else {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf, options_.growth_factor(),
                           options_.backoff_factor(), options_.growth_interval());
  }
  finish_update(found_inf);
}

void GradScaler::update_with_extensions(const at::Tensor& found_inf) {
  // DeepSpeed's DynamicLossScaler.update_scale, kept on the device.
  const auto overflow = found_inf.gt(0);
  const auto hysteresis_spent = hysteresis_tracker_.le(1);
  if (options_.min_scale() > 0) {
    // Backing off at the floor would skip steps forever: stop with an error instead.
    // Reading the flag is the one host sync this option costs.
    const bool stuck = (overflow & hysteresis_spent & scale_.le(options_.min_scale())).item<bool>();
    TORCH_CHECK(!stuck,
                "Current loss scale already at minimum - cannot decrease scale anymore. "
                "The loss scale is ",
                options_.min_scale(),
                " (min_scale) and the gradients still "
                "overflow: try bf16, a lower learning rate, or gradient clipping.");
  }
  auto backed_off = scale_ * options_.backoff_factor();
  if (options_.min_scale() > 0) backed_off = at::clamp_min(backed_off, options_.min_scale());

  const auto next_tracker = growth_tracker_ + 1;
  const auto grow = overflow.logical_not() & next_tracker.ge(options_.growth_interval());
  auto grown = scale_ * options_.growth_factor();
  grown = at::where(at::isfinite(grown), at::clamp_max(grown, options_.max_scale()), scale_);

  const auto new_scale = at::where(overflow, at::where(hysteresis_spent, backed_off, scale_),
                                   at::where(grow, grown, scale_));
  const auto new_tracker =
      at::where(overflow | grow, at::zeros_like(growth_tracker_), next_tracker);
  const auto refill = at::full_like(hysteresis_tracker_, options_.hysteresis());
  const auto refill_now = options_.consecutive_hysteresis() ? overflow.logical_not() : grow;
  const auto new_hysteresis =
      at::where(overflow, at::where(hysteresis_spent, hysteresis_tracker_, hysteresis_tracker_ - 1),
                at::where(refill_now, refill, hysteresis_tracker_));
  scale_.copy_(new_scale);
  growth_tracker_.copy_(new_tracker);
  hysteresis_tracker_.copy_(new_hysteresis);
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) return;
  check_scale_growth_tracker("update");
  scale_.fill_(new_scale);
  finish_update(combined_found_inf());
}

void GradScaler::update(const at::Tensor& new_scale) {
  if (!options_.enabled()) return;
  check_scale_growth_tracker("update");
  constexpr const char* reason =
      "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
      "torch.FloatTensor with requires_grad=False.";
  TORCH_CHECK(new_scale.device().type() == scale_.device().type(), reason);
  TORCH_CHECK(new_scale.numel() == 1, reason);
  TORCH_CHECK(!new_scale.requires_grad(), reason);
  scale_.copy_(new_scale.reshape({}));
  finish_update(combined_found_inf());
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale();
}

std::int64_t GradScaler::get_growth_tracker() const {
  if (!options_.enabled()) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<std::int64_t>() : init_growth_tracker_;
}

void GradScaler::set_growth_factor(double new_factor) {
  check_growth_factor(new_factor);
  options_.growth_factor(new_factor);
}
void GradScaler::set_backoff_factor(double new_factor) {
  check_backoff_factor(new_factor);
  options_.backoff_factor(new_factor);
}
void GradScaler::set_growth_interval(std::int64_t new_interval) {
  check_growth_interval(new_interval);
  options_.growth_interval(new_interval);
}

std::int64_t GradScaler::skipped_steps() const {
  return skipped_steps_.defined() ? skipped_steps_.item<std::int64_t>() : 0;
}

bool GradScaler::last_step_skipped() const {
  return last_found_inf_.defined() && last_found_inf_.item<double>() > 0;
}

c10::impl::GenericDict GradScaler::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  if (!options_.enabled()) return state;
  state.insert("scale", get_scale());
  state.insert("growth_factor", options_.growth_factor());
  state.insert("backoff_factor", options_.backoff_factor());
  state.insert("growth_interval", options_.growth_interval());
  state.insert("_growth_tracker", get_growth_tracker());
  if (extensions_enabled()) {
    state.insert("_hysteresis_tracker", hysteresis_tracker_.defined()
                                            ? hysteresis_tracker_.item<std::int64_t>()
                                            : init_hysteresis_tracker_);
  }
  return state;
}

void GradScaler::load_state_dict(const c10::impl::GenericDict& state) {
  if (!options_.enabled()) return;
  TORCH_CHECK(state.size() != 0,
              "The source state dict is empty, possibly because it was saved from a disabled "
              "instance of GradScaler.");
  auto get = [&](const char* key) -> c10::IValue {
    TORCH_CHECK_VALUE(state.contains(key), "GradScaler state dict has no key '", key, "'");
    return state.at(key);
  };
  auto as_double = [&](const char* key) {
    const auto value = get(key);
    TORCH_CHECK_VALUE(value.isDouble() || value.isInt(), "GradScaler state dict: '", key,
                      "' must be a number, got ", value.tagKind());
    return value.isDouble() ? value.toDouble() : static_cast<double>(value.toInt());
  };
  auto as_int = [&](const char* key) {
    const auto value = get(key);
    TORCH_CHECK_VALUE(value.isInt(), "GradScaler state dict: '", key, "' must be an int, got ",
                      value.tagKind());
    return value.toInt();
  };
  const double new_scale = as_double("scale");
  const double growth_factor = as_double("growth_factor");
  const double backoff_factor = as_double("backoff_factor");
  const std::int64_t growth_interval = as_int("growth_interval");
  const std::int64_t growth_tracker = as_int("_growth_tracker");
  check_growth_factor(growth_factor);
  check_backoff_factor(backoff_factor);
  check_growth_interval(growth_interval);
  // What update() can produce: a finite positive scale, 0 <= tracker < interval. Anything
  // else would turn every gradient into inf/nan (scale 0, nan, inf) or flip its sign.
  TORCH_CHECK_VALUE(std::isfinite(new_scale) && new_scale > 0, "GradScaler state dict: 'scale' is ",
                    new_scale, ", but a loss scale must be a finite number > 0");
  TORCH_CHECK_VALUE(std::isfinite(growth_factor), "GradScaler state dict: 'growth_factor' is ",
                    growth_factor, ", but it must be finite");
  TORCH_CHECK_VALUE(growth_tracker >= 0 && growth_tracker < growth_interval,
                    "GradScaler state dict: '_growth_tracker' is ", growth_tracker,
                    ", outside [0, growth_interval=", growth_interval, ")");
  const std::int64_t hysteresis_tracker = state.contains("_hysteresis_tracker")
                                              ? as_int("_hysteresis_tracker")
                                              : init_hysteresis_tracker_;
  TORCH_CHECK_VALUE(hysteresis_tracker >= 1, "GradScaler state dict: '_hysteresis_tracker' is ",
                    hysteresis_tracker, ", but it must be >= 1");

  options_.init_scale(new_scale);
  if (scale_.defined()) scale_.fill_(new_scale);
  options_.growth_factor(growth_factor);
  options_.backoff_factor(backoff_factor);
  options_.growth_interval(growth_interval);
  init_growth_tracker_ = growth_tracker;
  if (growth_tracker_.defined()) growth_tracker_.fill_(growth_tracker);
  if (state.contains("_hysteresis_tracker")) {
    init_hysteresis_tracker_ = hysteresis_tracker;
    if (hysteresis_tracker_.defined()) hysteresis_tracker_.fill_(init_hysteresis_tracker_);
  }
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  for (const auto& entry : state_dict()) archive.write(entry.key().toStringRef(), entry.value());
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    archive.read(key, value);
    state.insert(key, value);
  }
  load_state_dict(state);
}

void GradScaler::save(const std::string& path) const {
  // torch.save's format without TorchScript's type tags, so torch.load(weights_only=True) reads it.
  const auto bytes = io::torch_save_bytes(c10::IValue(state_dict()));
  io::write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
}

void GradScaler::load(const std::string& path) {
  const auto value = io::load_torch_file(path);
  TORCH_CHECK_VALUE(value.isGenericDict(), "'", path, "' does not hold a GradScaler state dict, ",
                    "but a ", value.tagKind());
  load_state_dict(value.toGenericDict());
}

}  // namespace mantissa::amp
