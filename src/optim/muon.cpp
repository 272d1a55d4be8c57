// Muon's step (the Newton-Schulz orthogonalisation in bf16, then the scaled update) and the
// auxiliary AdamW's, each in the order of operations of its PyTorch counterpart, and the archives.
#include <mantissa/optim/muon.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>

#include <mantissa/amp/master_weights.h>

#include "optim/low_precision_write.h"

namespace mantissa::optim {
namespace {

void check_options(const MuonOptions& o) {
  TORCH_CHECK_VALUE(o.lr() >= 0, "Muon: learning rate should be >= 0 but is: ", o.lr());
  TORCH_CHECK_VALUE(o.momentum() >= 0, "Muon: momentum should be >= 0 but is: ", o.momentum());
  TORCH_CHECK_VALUE(o.weight_decay() >= 0,
                    "Muon: weight decay should be >= 0 but is: ", o.weight_decay());
  TORCH_CHECK_VALUE(o.ns_steps() >= 1 && o.ns_steps() < 100,
                    "Muon: ns_steps must be in [1, 100), got ", o.ns_steps());
  TORCH_CHECK_VALUE(o.eps() >= 0, "Muon: eps must be >= 0, got ", o.eps());
  const auto [beta1, beta2] = o.betas();
  TORCH_CHECK_VALUE(beta1 >= 0 && beta1 < 1,
                    "Muon's AdamW: invalid beta parameter at index 0: ", beta1);
  TORCH_CHECK_VALUE(beta2 >= 0 && beta2 < 1,
                    "Muon's AdamW: invalid beta parameter at index 1: ", beta2);
  TORCH_CHECK_VALUE(o.adam_eps() >= 0, "Muon's AdamW: invalid epsilon value: ", o.adam_eps());
}

double adjusted_lr(double lr, MuonAdjustLr fn, at::IntArrayRef shape) {
  const auto rows = static_cast<double>(shape[0]);
  const auto cols = static_cast<double>(shape[1]);
  switch (fn) {
    case MuonAdjustLr::kOriginal:
      return lr * std::sqrt(std::max(1.0, rows / cols));
    case MuonAdjustLr::kMatchRmsAdamW:
      return lr * (0.2 * std::sqrt(std::max(rows, cols)));
  }
  return lr;
}

// How a pure bf16/fp16 tensor's new weight is written (`rule` kNearest for the others): with
// kNearest the update runs in the tensor's dtype, as PyTorch's; else in fp32, written by the
// rule under `key`.
struct WriteRule {
  LowPrecisionUpdate rule = LowPrecisionUpdate::kNearest;
  detail::RoundingKey key;
};

void muon_update(at::Tensor& p, MuonParamState& state, const MuonOptions& o, WriteRule write) {
  const auto& grad = p.grad();
  if (!state.momentum_buffer().defined()) state.momentum_buffer(at::zeros_like(grad));
  state.step(state.step() + 1);
  auto& buf = state.momentum_buffer();
  buf.lerp_(grad, 1 - o.momentum());
  const auto update = muon_orthogonalise(o.nesterov() ? grad.lerp(buf, o.momentum()) : buf, o);
  const double lr = adjusted_lr(o.lr(), o.adjust_lr_fn(), p.sizes());
  if (write.rule == LowPrecisionUpdate::kNearest) {
    p.mul_(1 - o.lr() * o.weight_decay());
    p.add_(update, -lr);
    return;
  }
  auto target = p.to(at::kFloat).mul_(1 - o.lr() * o.weight_decay());
  target.add_(update.to(at::kFloat), -lr);
  write.key.step = static_cast<std::uint32_t>(state.step());
  detail::write_low_precision_(p, target, write.rule, state.kahan_comp(), write.key, "Muon");
}

void adamw_update(at::Tensor& p, MuonParamState& state, const MuonOptions& o, WriteRule write) {
  const auto& grad = p.grad();
  if (!state.exp_avg().defined()) {
    state.exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    state.exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
  }
  const auto [beta1, beta2] = o.betas();
  state.step(state.step() + 1);
  const bool nearest = write.rule == LowPrecisionUpdate::kNearest;
  // Under a rule the new weight is computed in fp32 from the start, the decay included.
  auto target = nearest ? p : p.to(at::kFloat);
  if (o.weight_decay() != 0) target.mul_(1 - o.lr() * o.weight_decay());
  state.exp_avg().lerp_(grad, 1 - beta1);
  state.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  const auto step = static_cast<double>(state.step());
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double step_size = o.lr() / bias_correction1;
  if (nearest) {
    const auto denom =
        (state.exp_avg_sq().sqrt() / std::pow(bias_correction2, 0.5)).add_(o.adam_eps());
    p.addcdiv_(state.exp_avg(), denom, -step_size);
    return;
  }
  const auto denom = (state.exp_avg_sq().to(at::kFloat).sqrt() / std::pow(bias_correction2, 0.5))
                         .add_(o.adam_eps());
  target.addcdiv_(state.exp_avg().to(at::kFloat), denom, -step_size);
  write.key.step = static_cast<std::uint32_t>(state.step());
  detail::write_low_precision_(p, target, write.rule, state.kahan_comp(), write.key, "Muon");
}

}  // namespace

const char* to_string(MuonAdjustLr fn) {
  return fn == MuonAdjustLr::kMatchRmsAdamW ? "match_rms_adamw" : "original";
}

MuonAdjustLr parse_muon_adjust_lr(const std::string& text) {
  if (text == "original" || text == "None") return MuonAdjustLr::kOriginal;
  if (text == "match_rms_adamw") return MuonAdjustLr::kMatchRmsAdamW;
  TORCH_CHECK_VALUE(false, "Muon: adjust_lr_fn ", text,
                    " is not supported (use original or match_rms_adamw)");
}

at::Tensor muon_orthogonalise(const at::Tensor& update, const MuonOptions& options) {
  TORCH_CHECK_VALUE(update.dim() == 2, "Muon orthogonalises 2-d matrices, got shape ",
                    update.sizes());
  const auto [a, b, c] = options.ns_coefficients();
  const bool tall = update.size(0) > update.size(1);
  auto x = update.to(at::kBFloat16);
  if (tall) x = x.t();
  // A copy before dividing in place: `to` returns `update` itself when it is bf16 already.
  x = x.div(x.norm().clamp_min(options.eps()));
  for (int64_t i = 0; i < options.ns_steps(); ++i) {
    const auto gram = at::matmul(x, x.t());
    const auto poly = at::addmm(gram, gram, gram, /*beta=*/b, /*alpha=*/c);
    x = at::addmm(x, poly, x, /*beta=*/a);
  }
  return tall ? x.t() : x;
}

MuonOptions::MuonOptions(double lr) : lr_(lr) {}

void MuonOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("use_muon", c10::IValue(use_muon()));
  archive.write("momentum", c10::IValue(momentum()));
  archive.write("nesterov", c10::IValue(nesterov()));
  archive.write("ns_coefficients", c10::IValue(ns_coefficients()));
  archive.write("eps", c10::IValue(eps()));
  archive.write("ns_steps", c10::IValue(ns_steps()));
  archive.write("adjust_lr_fn", c10::IValue(std::string(to_string(adjust_lr_fn()))));
  archive.write("betas", c10::IValue(betas()));
  archive.write("adam_eps", c10::IValue(adam_eps()));
}

void MuonOptions::serialize(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* key) {
    c10::IValue value;
    TORCH_CHECK_VALUE(archive.try_read(key, value), "Muon options: the archive has no '", key, "'");
    return value;
  };
  lr(read("lr").toDouble());
  weight_decay(read("weight_decay").toDouble());
  use_muon(read("use_muon").toBool());
  momentum(read("momentum").toDouble());
  nesterov(read("nesterov").toBool());
  ns_coefficients(read("ns_coefficients").to<coefficients_t>());
  eps(read("eps").toDouble());
  ns_steps(read("ns_steps").toInt());
  adjust_lr_fn(parse_muon_adjust_lr(read("adjust_lr_fn").toStringRef()));
  betas(read("betas").to<betas_t>());
  adam_eps(read("adam_eps").toDouble());
}

double MuonOptions::get_lr() const { return lr(); }
void MuonOptions::set_lr(const double lr) { this->lr(lr); }

void MuonParamState::serialize(torch::serialize::OutputArchive& archive) const {
  if (momentum_buffer().defined()) archive.write("momentum_buffer", momentum_buffer());
  if (exp_avg().defined()) {
    archive.write("exp_avg", exp_avg());
    archive.write("exp_avg_sq", exp_avg_sq());
  }
  if (exp_avg().defined() || step() > 0) archive.write("step", c10::IValue(step()));
  if (kahan_comp().defined()) archive.write("kahan_comp", kahan_comp());
}

void MuonParamState::serialize(torch::serialize::InputArchive& archive) {
  auto read_tensor = [&](const char* key) {
    c10::IValue tensor;
    return archive.try_read(key, tensor) ? tensor.toTensor() : at::Tensor();
  };
  momentum_buffer(read_tensor("momentum_buffer"));
  exp_avg(read_tensor("exp_avg"));
  exp_avg_sq(read_tensor("exp_avg_sq"));
  kahan_comp(read_tensor("kahan_comp"));
  c10::IValue value;
  step(archive.try_read("step", value) ? value.toInt() : 0);
}

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<MuonOptions>(defaults)) {
  check_options(defaults);
  for (const auto& group : param_groups_) {
    const auto& options = static_cast<const MuonOptions&>(group.options());
    check_options(options);
    if (!options.use_muon()) continue;
    for (const auto& p : group.params()) {
      TORCH_CHECK_VALUE(p.dim() == 2,
                        "Muon only updates 2-d tensors, but a use_muon group holds one of shape ",
                        p.sizes(), "; put it in a group with use_muon false (AdamW)");
    }
  }
}

at::Tensor Muon::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_mode(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  std::uint32_t index = 0;  // over all groups: the key of stochastic rounding, as FusedAdamW's
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const MuonOptions&>(group.options());
    for (auto& p : group.params()) {
      const auto tensor_index = rounding_index(index++);
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "Muon does not take sparse gradients");
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) slot = std::make_unique<MuonParamState>();
      auto& state = static_cast<MuonParamState&>(*slot);
      WriteRule write;
      if (amp::is_low_precision(p.scalar_type())) {
        write = {low_precision_update(), {stochastic_rounding_seed(), tensor_index, 0}};
      }
      if (options.use_muon()) {
        muon_update(p, state, options, write);
      } else {
        adamw_update(p, state, options, write);
      }
    }
  }
  return loss;
}

void Muon::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<MuonParamState, MuonOptions>(archive, *this);
}

void Muon::load(torch::serialize::InputArchive& archive) {
  // Muon keeps its three groups, empty or not; an archive of another count is refused here by
  // name rather than by LibTorch's serialize.
  torch::serialize::InputArchive groups;
  at::Tensor saved_groups;
  if (archive.try_read("param_groups", groups) &&
      groups.try_read("param_groups/size", saved_groups) && saved_groups.numel() == 1) {
    const auto count = saved_groups.item<std::int64_t>();
    TORCH_CHECK_VALUE(count == static_cast<std::int64_t>(param_groups_.size()),
                      "Muon: the archive holds ", count, " param groups, this optimizer has ",
                      param_groups_.size(),
                      " (the Muon group, AdamW's decaying and non-decaying groups, kept even "
                      "when empty; builds before 2026-12-07 left an empty one out, and their "
                      "optimizer.pt cannot be resumed: start a run from that checkpoint's "
                      "model.safetensors instead)");
  }
  torch::optim::serialize<MuonParamState, MuonOptions>(archive, *this);
  std::size_t index = 0;
  for (auto& group : param_groups_) {
    const bool use_muon = static_cast<const MuonOptions&>(group.options()).use_muon();
    for (auto& p : group.params()) {
      const auto position = index++;
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it == state_.end()) continue;
      auto& state = static_cast<MuonParamState&>(*it->second);
      auto fit = [&](const char* name, const at::Tensor& t, bool wanted) -> at::Tensor {
        TORCH_CHECK_VALUE(t.defined() == wanted, "the state of parameter ", position, " ",
                          wanted ? "lacks" : "has", " '", name, "' (its group ",
                          use_muon ? "is Muon's" : "is AdamW's", ")");
        if (!t.defined()) return t;
        TORCH_CHECK_VALUE(at::isFloatingType(t.scalar_type()), "the state '", name,
                          "' of parameter ", position, " is ", t.scalar_type(),
                          ", not a floating-point tensor");
        TORCH_CHECK_VALUE(t.sizes() == p.sizes(), "the state '", name, "' of parameter ", position,
                          " has shape ", t.sizes(), " but the parameter has shape ", p.sizes());
        return t.to(p.options().requires_grad(false));
      };
      state.momentum_buffer(fit("momentum_buffer", state.momentum_buffer(), use_muon));
      state.exp_avg(fit("exp_avg", state.exp_avg(), !use_muon));
      state.exp_avg_sq(fit("exp_avg_sq", state.exp_avg_sq(), !use_muon));
      if (state.kahan_comp().defined()) {
        const auto comp = fit("kahan_comp", state.kahan_comp(), true);
        TORCH_CHECK_VALUE(amp::is_low_precision(p.scalar_type()), "the state of parameter ",
                          position, " has 'kahan_comp', but the parameter is ", p.scalar_type(),
                          ": only bf16/fp16 parameters keep one");
        state.kahan_comp(comp);
      }
      TORCH_CHECK_VALUE(state.step() >= 0, "the state 'step' of parameter ", position, " is ",
                        state.step());
    }
  }
}

}  // namespace mantissa::optim
