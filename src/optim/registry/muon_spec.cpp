// "muon": mantissa's Muon over the 2-d weights inside the model's blocks, AdamW over the rest
// (embeddings, the LM head, norms, biases), as the reference recipe splits them. HF has no
// Muon yet; the hyperparameters take torch.optim.Muon's names through optim_args.
#include <mantissa/optim/muon.h>

#include <sstream>

#include "optim/optim_args.h"
#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {
namespace {

constexpr const char* kName = "muon";
constexpr const char* kDefaultAdamWParams = "embed|wte|wpe|lm_head";

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, separator)) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

struct MuonSettings {
  MuonOptions muon;   // the Muon group's options
  MuonOptions adamw;  // the AdamW groups' (use_muon false)
  std::vector<std::string> adamw_params;
};

MuonSettings muon_settings(const TrainingArguments& args) {
  OptimArgs extra(args.optim_args(), kName);
  MuonSettings s;
  auto& m = s.muon;
  m.lr(args.learning_rate()).weight_decay(args.weight_decay());
  m.momentum(extra.take_double("momentum", m.momentum()))
      .nesterov(extra.take_bool("nesterov", m.nesterov()))
      .ns_steps(extra.take_int("ns_steps", m.ns_steps()))
      .eps(extra.take_double("eps", m.eps()))
      .adjust_lr_fn(parse_muon_adjust_lr(extra.take_string("adjust_lr_fn", "original")))
      .betas(std::make_tuple(args.adam_beta1(), args.adam_beta2()))
      .adam_eps(args.adam_epsilon());
  const auto coefficients = extra.take_string("ns_coefficients", "");
  if (!coefficients.empty()) {
    std::string bare = coefficients;
    if (bare.size() >= 2 && bare.front() == '(' && bare.back() == ')') {
      bare = bare.substr(1, bare.size() - 2);
    }
    const auto parts = split(bare, ':');
    TORCH_CHECK_VALUE(parts.size() == 3, "optim_args: ns_coefficients=", coefficients,
                      " must be three numbers a:b:c (optim muon)");
    m.ns_coefficients(std::make_tuple(OptimArgs::to_double("ns_coefficients", parts[0], kName),
                                      OptimArgs::to_double("ns_coefficients", parts[1], kName),
                                      OptimArgs::to_double("ns_coefficients", parts[2], kName)));
  }
  s.adamw = MuonOptions(m).use_muon(false).lr(extra.take_double("adamw_lr", args.learning_rate()));
  s.adamw_params = split(extra.take_string("adamw_params", kDefaultAdamWParams), '|');
  extra.finish();
  Muon probe({}, m);  // the constructor's checks, for validate()
  Muon probe_adamw({}, s.adamw);
  return s;
}

bool kept_on_adamw(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& pattern : patterns) {
    if (name.find(pattern) != std::string::npos) return true;
  }
  return false;
}

std::unique_ptr<torch::optim::Optimizer> build_muon(OptimizerBuildInputs inputs) {
  const auto settings = muon_settings(inputs.args);
  // Group 0 Muon (decaying), then AdamW's decaying and non-decaying groups, always all three,
  // empty or not: the processes of a job that shards the state by whole tensors each build over
  // their own tensors and must still agree on the groups (the scheduler and the checkpoint
  // count them).
  std::vector<at::Tensor> muon, adamw_decay, adamw_no_decay;
  for (std::size_t g = 0; g < inputs.groups.size(); ++g) {
    const bool decays = g == 0 && inputs.first_group_decays;
    const auto& params = inputs.groups[g].params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string name = g < inputs.group_names.size() && i < inputs.group_names[g].size()
                                   ? inputs.group_names[g][i]
                                   : "";
      if (decays && params[i].dim() == 2 && !kept_on_adamw(name, settings.adamw_params)) {
        muon.push_back(params[i]);
      } else {
        (decays ? adamw_decay : adamw_no_decay).push_back(params[i]);
      }
    }
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto add = [&](std::vector<at::Tensor> params, MuonOptions options) {
    groups.emplace_back(std::move(params), std::make_unique<MuonOptions>(options));
  };
  add(std::move(muon), settings.muon);
  add(std::move(adamw_decay), settings.adamw);
  add(std::move(adamw_no_decay), MuonOptions(settings.adamw).weight_decay(0.0));
  auto built = std::make_unique<Muon>(std::move(groups), MuonOptions(settings.muon));
  built->set_low_precision_update(inputs.low_precision_update,
                                  static_cast<std::uint64_t>(inputs.args.seed()));
  return built;
}

StateTensors muon_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const MuonParamState*>(&base);
  if (state == nullptr) return {};
  return {{"momentum_buffer", state->momentum_buffer()},
          {"exp_avg", state->exp_avg()},
          {"exp_avg_sq", state->exp_avg_sq(), /*non_negative=*/true},
          {"kahan_comp", state->kahan_comp()}};
}

std::vector<GroupOption> muon_group_options(const torch::optim::OptimizerOptions& base) {
  const auto& o = static_cast<const MuonOptions&>(base);
  return {{"lr", o.lr()},
          {"weight_decay", o.weight_decay()},
          {"momentum", o.momentum()},
          {"ns_coefficients[0]", std::get<0>(o.ns_coefficients()), /*non_negative=*/false},
          {"ns_coefficients[1]", std::get<1>(o.ns_coefficients()), /*non_negative=*/false},
          {"ns_coefficients[2]", std::get<2>(o.ns_coefficients()), /*non_negative=*/false},
          {"eps", o.eps()},
          {"ns_steps", static_cast<double>(o.ns_steps())},
          {"betas[0]", std::get<0>(o.betas()), true, /*below_one=*/true},
          {"betas[1]", std::get<1>(o.betas()), true, /*below_one=*/true},
          {"adam_eps", o.adam_eps()}};
}

}  // namespace

OptimizerSpec muon_spec() {
  OptimizerSpec spec;
  spec.name = kName;
  spec.type = typeid(Muon);
  spec.family = "Muon";
  spec.family_marks = {"ns_coefficients", "use_muon"};
  spec.build = &build_muon;
  spec.check_arguments = [](const TrainingArguments& args) { muon_settings(args); };
  spec.state_tensors = &muon_tensors;
  spec.steps = [](const torch::optim::OptimizerParamState& base) -> std::optional<double> {
    const auto* state = dynamic_cast<const MuonParamState*>(&base);
    if (state == nullptr || state->momentum_buffer().defined()) return std::nullopt;
    return static_cast<double>(state->step());
  };
  spec.group_options = &muon_group_options;
  spec.low_precision_rules = true;
  spec.shards_whole_tensors = true;
  return spec;
}

}  // namespace mantissa::optim::detail
