// Adafactor's step and archives. The arithmetic follows HF's order of operations in fp32, so
// that the same gradients give the same parameters to float rounding.
#include <mantissa/optim/adafactor.h>

#include <cmath>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>

#include <mantissa/amp/master_weights.h>

#include "optim/low_precision_write.h"

namespace mantissa::optim {
namespace {

void check_options(const AdafactorOptions& o) {
  TORCH_CHECK_VALUE(o.lr() >= 0, "Adafactor: invalid learning rate: ", o.lr());
  TORCH_CHECK_VALUE(o.eps() >= 0, "Adafactor: invalid eps: ", o.eps());
  TORCH_CHECK_VALUE(o.clip_threshold() > 0, "Adafactor: clip_threshold must be positive, got ",
                    o.clip_threshold());
  TORCH_CHECK_VALUE(o.decay_rate() < 0,
                    "Adafactor: decay_rate must be negative (the decay at step t is "
                    "1 - t^decay_rate), got ",
                    o.decay_rate());
  TORCH_CHECK_VALUE(!o.beta1() || (*o.beta1() >= 0 && *o.beta1() <= 1),
                    "Adafactor: beta1 must be in [0, 1] or None, got ", o.beta1().value_or(0));
  TORCH_CHECK_VALUE(o.weight_decay() >= 0,
                    "Adafactor: invalid weight_decay value: ", o.weight_decay());
}

at::Tensor rms(const at::Tensor& t) {
  return t.norm(2) / std::sqrt(static_cast<double>(t.numel()));
}

AdafactorParamState fresh_state(const at::Tensor& grad, bool first_moment) {
  AdafactorParamState state;
  const auto shape = grad.sizes();
  if (grad.dim() >= 2) {
    std::vector<int64_t> row(shape.begin(), shape.end() - 1);
    std::vector<int64_t> col(shape.begin(), shape.end() - 2);
    col.push_back(shape.back());
    state.exp_avg_sq_row(at::zeros(row, grad.options()));
    state.exp_avg_sq_col(at::zeros(col, grad.options()));
  } else {
    state.exp_avg_sq(at::zeros_like(grad));
  }
  if (first_moment) state.exp_avg(at::zeros_like(grad));
  return state;
}

// One parameter's update, in fp32: returns what to subtract from the parameter.
at::Tensor scaled_update(const at::Tensor& grad, AdafactorParamState& state,
                         const AdafactorOptions& o) {
  const double beta2t = 1.0 - std::pow(static_cast<double>(state.step()), o.decay_rate());
  auto update = grad.square().add_(o.eps());
  if (grad.dim() >= 2) {
    auto& row = state.exp_avg_sq_row();
    auto& col = state.exp_avg_sq_col();
    row.mul_(beta2t).add_(update.mean(-1), 1.0 - beta2t);
    col.mul_(beta2t).add_(update.mean(-2), 1.0 - beta2t);
    // The factored estimate of 1/sqrt(second moment): row over its mean, times the column.
    auto row_factor = (row / row.mean(-1, /*keepdim=*/true)).rsqrt_().unsqueeze(-1);
    auto col_factor = col.unsqueeze(-2).rsqrt();
    update = at::mul(row_factor, col_factor).mul_(grad);
  } else {
    auto& sq = state.exp_avg_sq();
    sq.mul_(beta2t).add_(update, 1.0 - beta2t);
    update = sq.rsqrt().mul_(grad);
  }
  update.div_((rms(update) / o.clip_threshold()).clamp_(1.0));
  update.mul_(o.lr());
  if (o.beta1()) {
    auto& avg = state.exp_avg();
    avg.mul_(*o.beta1()).add_(update, 1.0 - *o.beta1());
    return avg;
  }
  return update;
}

}  // namespace

AdafactorOptions::AdafactorOptions(double lr) : lr_(lr) {}

void AdafactorOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("eps", c10::IValue(eps()));
  archive.write("clip_threshold", c10::IValue(clip_threshold()));
  archive.write("decay_rate", c10::IValue(decay_rate()));
  if (beta1()) archive.write("beta1", c10::IValue(*beta1()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
}

void AdafactorOptions::serialize(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* key) {
    c10::IValue value;
    TORCH_CHECK_VALUE(archive.try_read(key, value), "Adafactor options: the archive has no '", key,
                      "'");
    return value.toDouble();
  };
  lr(read("lr"));
  eps(read("eps"));
  clip_threshold(read("clip_threshold"));
  decay_rate(read("decay_rate"));
  weight_decay(read("weight_decay"));
  c10::IValue value;
  beta1(archive.try_read("beta1", value) ? std::optional<double>(value.toDouble()) : std::nullopt);
}

double AdafactorOptions::get_lr() const { return lr(); }
void AdafactorOptions::set_lr(const double lr) { this->lr(lr); }

void AdafactorParamState::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("step", c10::IValue(step()));
  for (const auto& [key, t] :
       {std::pair<const char*, const at::Tensor&>{"exp_avg_sq_row", exp_avg_sq_row()},
        {"exp_avg_sq_col", exp_avg_sq_col()},
        {"exp_avg_sq", exp_avg_sq()},
        {"exp_avg", exp_avg()},
        {"kahan_comp", kahan_comp()}}) {
    if (t.defined()) archive.write(key, t);
  }
}

void AdafactorParamState::serialize(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  TORCH_CHECK_VALUE(archive.try_read("step", value), "Adafactor state: the archive has no 'step'");
  step(value.toInt());
  auto read_tensor = [&](const char* key) {
    c10::IValue tensor;
    return archive.try_read(key, tensor) ? tensor.toTensor() : at::Tensor();
  };
  exp_avg_sq_row(read_tensor("exp_avg_sq_row"));
  exp_avg_sq_col(read_tensor("exp_avg_sq_col"));
  exp_avg_sq(read_tensor("exp_avg_sq"));
  exp_avg(read_tensor("exp_avg"));
  kahan_comp(read_tensor("kahan_comp"));
}

Adafactor::Adafactor(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     AdafactorOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<AdafactorOptions>(defaults)) {
  check_options(defaults);
  for (const auto& group : param_groups_) {
    check_options(static_cast<const AdafactorOptions&>(group.options()));
  }
}

Adafactor::Adafactor(std::vector<at::Tensor> params, AdafactorOptions defaults)
    : Adafactor({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

at::Tensor Adafactor::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_mode(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  std::uint32_t index = 0;  // over all groups: the key of stochastic rounding, as FusedAdamW's
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdafactorOptions&>(group.options());
    for (auto& p : group.params()) {
      const auto tensor_index = rounding_index(index++);
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "Adafactor does not take sparse gradients");
      const bool low_precision = amp::is_low_precision(p.scalar_type());
      const auto grad = p.grad().to(at::kFloat);
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot)
        slot =
            std::make_unique<AdafactorParamState>(fresh_state(grad, options.beta1().has_value()));
      auto& state = static_cast<AdafactorParamState&>(*slot);
      TORCH_CHECK_VALUE(!options.beta1() || state.exp_avg().defined(),
                        "Adafactor: beta1 is set but the state of a parameter has no exp_avg");
      state.step(state.step() + 1);
      auto update = scaled_update(grad, state, options);
      auto target = low_precision ? p.to(at::kFloat) : p;
      if (options.weight_decay() != 0) {
        target.add_(target, -options.weight_decay() * options.lr());
      }
      target.sub_(update);
      if (low_precision) {
        detail::write_low_precision_(
            p, target, low_precision_update(), state.kahan_comp(),
            {stochastic_rounding_seed(), tensor_index, static_cast<std::uint32_t>(state.step())},
            "Adafactor");
      }
    }
  }
  return loss;
}

void Adafactor::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdafactorParamState, AdafactorOptions>(archive, *this);
}

void Adafactor::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<AdafactorParamState, AdafactorOptions>(archive, *this);
  std::size_t index = 0;
  for (auto& group : param_groups_) {
    for (auto& p : group.params()) {
      const auto position = index++;
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it == state_.end()) continue;
      auto& state = static_cast<AdafactorParamState&>(*it->second);
      TORCH_CHECK_VALUE(state.step() >= 0, "the state 'step' of parameter ", position, " is ",
                        state.step());
      const auto sizes = p.sizes().vec();
      std::vector<int64_t> row(sizes.begin(), sizes.end() - (sizes.empty() ? 0 : 1));
      std::vector<int64_t> col;
      if (sizes.size() >= 2) {
        col.assign(sizes.begin(), sizes.end() - 2);
        col.push_back(sizes.back());
      }
      const bool factored = p.dim() >= 2;
      auto fit = [&](const char* name, const at::Tensor& t, bool wanted,
                     const std::vector<int64_t>& shape) -> at::Tensor {
        TORCH_CHECK_VALUE(t.defined() == wanted, "the state of parameter ", position, " (shape ",
                          p.sizes(), ") ", wanted ? "lacks" : "has", " '", name, "'");
        if (!t.defined()) return t;
        TORCH_CHECK_VALUE(at::isFloatingType(t.scalar_type()), "the state '", name,
                          "' of parameter ", position, " is ", t.scalar_type(),
                          ", not a floating-point tensor");
        TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(shape), "the state '", name,
                          "' of parameter ", position, " has shape ", t.sizes(), " but ",
                          at::IntArrayRef(shape), " was expected for a parameter of shape ",
                          p.sizes());
        return t.to(p.options().dtype(at::kFloat).requires_grad(false));
      };
      state.exp_avg_sq_row(fit("exp_avg_sq_row", state.exp_avg_sq_row(), factored, row));
      state.exp_avg_sq_col(fit("exp_avg_sq_col", state.exp_avg_sq_col(), factored, col));
      state.exp_avg_sq(fit("exp_avg_sq", state.exp_avg_sq(), !factored, sizes));
      if (state.exp_avg().defined()) state.exp_avg(fit("exp_avg", state.exp_avg(), true, sizes));
      if (state.kahan_comp().defined()) {
        // In the parameter's dtype, as the Kahan write keeps it.
        const auto comp = fit("kahan_comp", state.kahan_comp(), true, sizes);
        state.kahan_comp(comp.to(p.scalar_type()).contiguous());
      }
    }
  }
}

}  // namespace mantissa::optim
