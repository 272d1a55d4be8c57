// The pieces of ZeRO-2 (src/trainer/sharded/) across real processes joined over Gloo on
// 127.0.0.1, each result compared with one process running mantissa's FusedAdamW on the whole
// batch. One executable plays every part:
//
//   sharded_check check <scenario> [--deadline-s S]
//     the launcher: starts the ranks of each phase of the scenario (RANK, WORLD_SIZE, ... as
//     torchrun sets them, a free port), kills them at the deadline, and prints "check: PASSED"
//     when every rank of every phase exited 0. Scenarios:
//       fp32            2 ranks, fp32, accumulation over 2 micro-batches, clipping by the global
//                       norm: weights within 1e-6 relative, the gathered state equal to the one
//                       process's, 1/N of its state bytes, reduce-scatters launched in backward;
//                       in every compared scenario the global norm from the shards is bitwise
//                       get_total_norm's over the whole (all-gathered) gradients, as DDP clips
//       bf16_masters    2 ranks, bf16 model with fp32 master shards
//       fp16_scaler     2 ranks, fp16 model, masters, GradScaler; rank 0 injects an inf into one
//                       gradient element that lies in rank 1's shard: both ranks must skip
//       pure_bf16_kahan 2 ranks, bf16 without masters, Kahan-compensated updates, a bf16 norm
//       reshard         2 ranks train 6 steps and save the full state at step 3; then 2 ranks
//                       resume it (bitwise equal to the run that did not stop), 3 ranks and 1
//                       rank resume it (equal to one process resuming the same files)
//       layout          no processes: plan_flat_layout and FlatParameters on their own
//       rank_killed     rank 1 dies after a step: rank 0's next collective fails, no hang
//       bad_state       rank 0 is handed a state for another model: every rank stops with an
//                       error naming the cause (rank 0) or pointing to rank 0 (the others)
//   sharded_check rank <scenario> --phase P --dir D
//     one rank of one phase.
//
// Exit status: 0 when everything came out as expected.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/clip_grad.h>
#include <mantissa/distributed.h>
#include <mantissa/optim/fused_adamw.h>

#include "io/filesystem.h"
#include "multiprocess.h"
#include "trainer/sharded/flat_parameters.h"
#include "trainer/sharded/full_state.h"
#include "trainer/sharded/gradient_reduce_scatter.h"
#include "trainer/sharded/sharded_adamw.h"

namespace {

namespace dist = mantissa::distributed;
namespace sh = mantissa::detail::sharded;
using mantissa::amp::GradScaler;
using mantissa::amp::GradScalerOptions;
using mantissa::amp::MasterWeights;
using mantissa::optim::FusedAdamW;
using mantissa::optim::FusedAdamWOptions;
using mantissa::optim::LowPrecisionUpdate;

constexpr std::int64_t kBatch = 12;  // rows per micro-batch over all ranks: splits for 1, 2, 3
constexpr std::int64_t kMicroBatches = 2;
constexpr std::int64_t kBucketCapBytes = 1024;  // several buckets from a small model
constexpr double kLr = 1e-2;
constexpr int kDiedOnPurpose = 3;  // rank_killed: rank 1's exit status
constexpr int kNoticed = 4;        // rank_killed: rank 0's, once its collective failed
// Low-precision weights against one process: ||diff|| / ||weights||.
constexpr double kLowPrecisionWeightTol = 1e-2;

// How a scenario trains: the model's dtype, masters, the update rule, loss scaling, clipping.
struct Mode {
  c10::ScalarType dtype = torch::kFloat;
  bool masters = false;
  LowPrecisionUpdate rule = LowPrecisionUpdate::kNearest;
  bool scaler = false;
  double max_grad_norm = 0;
  std::int64_t inf_step = -1;  // the step whose gradients get an inf (rank 0 only, sharded)
};

Mode mode_of(const std::string& scenario) {
  Mode m;
  if (scenario == "fp32" || scenario == "reshard" || scenario == "bad_state") {
    m.max_grad_norm = 0.05;  // small enough that clipping acts on every step
  } else if (scenario == "bf16_masters") {
    m.dtype = torch::kBFloat16;
    m.masters = true;
    m.max_grad_norm = 0.05;
  } else if (scenario == "fp16_scaler") {
    m.dtype = torch::kHalf;
    m.masters = true;
    m.scaler = true;
    m.inf_step = 2;
    m.max_grad_norm = 0.05;
  } else if (scenario == "pure_bf16_kahan") {
    m.dtype = torch::kBFloat16;
    m.rule = LowPrecisionUpdate::kKahan;
    m.max_grad_norm = 0.05;  // bf16 gradients: a bf16 norm, as clip_grad_norm_ gives
  } else {
    throw std::invalid_argument("unknown scenario '" + scenario + "'");
  }
  return m;
}

struct NetImpl : torch::nn::Module {
  NetImpl() {
    torch::manual_seed(7);
    fc1 = register_module("fc1", torch::nn::Linear(12, 40));
    fc2 = register_module("fc2", torch::nn::Linear(40, 24));
    fc3 = register_module("fc3", torch::nn::Linear(24, 5));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

// HF's weight-decay groups: matrices decay, biases do not.
std::vector<std::vector<torch::Tensor>> groups_of(const std::vector<torch::Tensor>& params) {
  std::vector<std::vector<torch::Tensor>> groups(2);
  for (const auto& p : params) groups[p.dim() >= 2 ? 0 : 1].push_back(p);
  return groups;
}

std::vector<FusedAdamWOptions> group_options(const Mode& mode) {
  FusedAdamWOptions decay(kLr);
  decay.weight_decay(0.1).low_precision_update(mode.rule);
  FusedAdamWOptions no_decay = decay;
  no_decay.weight_decay(0.0);
  return {decay, no_decay};
}

// FusedAdamW over this process's shard of each bucket (their fp32 masters with `mode.masters`),
// grouped as the buckets are: what the Trainer builds over ShardedDataParallel's
// optimizer_params. The masters' tensors live on in the optimizer and ShardedAdamW.
struct ShardOptimizer {
  std::unique_ptr<MasterWeights> masters;
  std::shared_ptr<FusedAdamW> optimizer;
};

ShardOptimizer shard_optimizer(sh::FlatParameters& flat, const Mode& mode) {
  std::vector<at::Tensor> shards;
  for (std::size_t b = 0; b < flat.layout().buckets.size(); ++b) shards.push_back(flat.shard(b));
  ShardOptimizer out;
  if (mode.masters) out.masters = std::make_unique<MasterWeights>(shards);
  std::vector<std::vector<at::Tensor>> tensors(flat.num_groups());
  for (std::size_t b = 0; b < shards.size(); ++b) {
    tensors.at(flat.layout().buckets[b].group)
        .push_back(out.masters ? out.masters->master_params()[b] : shards[b]);
  }
  const auto options = group_options(mode);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (std::size_t g = 0; g < tensors.size(); ++g) {
    groups.emplace_back(tensors[g], std::make_unique<FusedAdamWOptions>(options.at(g)));
  }
  out.optimizer = std::make_shared<FusedAdamW>(std::move(groups));
  return out;
}

// Micro-batch `micro` of step `step`: the same rows on every process.
std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t step, std::int64_t micro) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step * 10 + micro);
  auto x = at::randn({kBatch, 12}, gen);
  auto y = at::randn({kBatch, 5}, gen);
  return {x, y};
}

torch::Tensor loss_on(Net& net, const torch::Tensor& x, const torch::Tensor& y,
                      c10::ScalarType dtype) {
  return torch::mse_loss(net->forward(x.to(dtype)).to(torch::kFloat), y);
}

// The largest difference relative to the largest magnitude of `want`.
double rel_diff(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.detach().to(torch::kDouble).cpu();
  const auto w = want.detach().to(torch::kDouble).cpu();
  const double scale = std::max(w.abs().max().item<double>(), 1e-30);
  return (g - w).abs().max().item<double>() / scale;
}

// ||got - want|| / ||want||: for low-precision runs, where Adam's sign-like first steps turn a
// rounding difference in a near-zero gradient into a whole step on a few elements.
double rel_norm_diff(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.detach().to(torch::kDouble).cpu();
  const auto w = want.detach().to(torch::kDouble).cpu();
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
}

// Every check prints what it compared, so a failure shows the numbers.
struct Report {
  std::int64_t rank;
  bool ok = true;
  void expect(bool pass, const std::string& what) {
    std::cout << "rank " << rank << ": " << (pass ? "ok   " : "FAIL ") << what << std::endl;
    ok &= pass;
  }
  void within(double got, double tol, const std::string& what) {
    std::ostringstream line;
    line << what << ": " << std::setprecision(3) << got << " (limit " << tol << ")";
    expect(got <= tol, line.str());
  }
};

// ---- one process, the whole batch: the reference ---------------------------------------

struct SingleProcess {
  Mode mode;
  Net net;
  std::unique_ptr<MasterWeights> masters;
  std::unique_ptr<FusedAdamW> optimizer;
  std::unique_ptr<GradScaler> scaler;
  std::vector<torch::Tensor> opt_tensors;  // what the optimizer updates, in net->parameters order
  std::vector<double> norms;

  explicit SingleProcess(const Mode& m) : mode(m) {
    net->to(mode.dtype);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    const auto options = group_options(mode);
    if (mode.masters) masters = std::make_unique<MasterWeights>(net->parameters());
    const auto model_groups = groups_of(net->parameters());
    for (std::size_t g = 0; g < model_groups.size(); ++g) {
      auto tensors = masters ? masters->masters_for(model_groups[g]) : model_groups[g];
      groups.emplace_back(tensors, std::make_unique<FusedAdamWOptions>(options[g]));
    }
    optimizer = std::make_unique<FusedAdamW>(std::move(groups));
    if (masters) optimizer->link_model_params(*masters);
    opt_tensors = masters ? masters->master_params() : net->parameters();
    if (mode.scaler) scaler = std::make_unique<GradScaler>(GradScalerOptions().init_scale(1024.));
  }

  // The tensor the optimizer updates in place of parameter `p`.
  torch::Tensor tensor_of(const torch::Tensor& p) const {
    return masters ? masters->master_of(p) : p;
  }

  void step(std::int64_t s, const std::function<torch::Tensor(torch::Tensor)>& inject) {
    for (std::int64_t m = 0; m < kMicroBatches; ++m) {
      auto [x, y] = batch(s, m);
      auto loss = loss_on(net, x, y, mode.dtype) / double(kMicroBatches);
      if (m == kMicroBatches - 1 && s == mode.inf_step) loss = inject(loss);
      (scaler ? scaler->scale(loss) : loss).backward();
    }
    if (masters) masters->copy_grads_to_masters();
    if (scaler) scaler->unscale_(*optimizer);
    if (mode.max_grad_norm > 0) {
      norms.push_back(mantissa::clip_grad_norm_(opt_tensors, mode.max_grad_norm).item<double>());
    }
    if (scaler) {
      scaler->step(*optimizer);
      scaler->update();
    } else {
      optimizer->step();
    }
    optimizer->zero_grad();
    net->zero_grad();
    if (masters) masters->zero_grad();
  }
};

// ---- the sharded run ---------------------------------------------------------------------

struct Sharded {
  Mode mode;
  dist::DistributedEnvironment env;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  Net net;
  std::unique_ptr<sh::FlatParameters> flat;
  std::unique_ptr<sh::GradientReduceScatter> grads;
  std::unique_ptr<sh::ShardedAdamW> shards;
  std::unique_ptr<GradScaler> scaler;
  std::vector<double> norms;
  std::vector<std::string> unequal_norms;  // steps whose norm is not get_total_norm's, bitwise
  std::vector<std::size_t> overlapped;

  Sharded(const Mode& m, dist::DistributedEnvironment e, c10::intrusive_ptr<c10d::ProcessGroup> g,
          const std::vector<torch::Tensor>* start_weights = nullptr)
      : mode(m), env(std::move(e)), group(std::move(g)) {
    net->to(mode.dtype);
    if (start_weights != nullptr) {
      torch::NoGradGuard no_grad;
      auto params = net->parameters();
      for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_((*start_weights)[i]);
    }
    flat = std::make_unique<sh::FlatParameters>(groups_of(net->parameters()), env.rank,
                                                env.world_size, kBucketCapBytes);
    grads = std::make_unique<sh::GradientReduceScatter>(*flat, group);
    auto built = shard_optimizer(*flat, mode);
    shards = std::make_unique<sh::ShardedAdamW>(*flat, *grads, built.optimizer, built.masters.get(),
                                                group);
    if (mode.scaler) {
      scaler = std::make_unique<GradScaler>(GradScalerOptions().init_scale(1024.));
      scaler->set_found_inf_reduction([this](at::Tensor& f) { shards->agree_found_inf_(f); });
    }
  }

  void step(std::int64_t s, const std::function<torch::Tensor(torch::Tensor)>& inject) {
    const std::int64_t rows = kBatch / env.world_size;
    for (std::int64_t m = 0; m < kMicroBatches; ++m) {
      auto [x, y] = batch(s, m);
      x = x.narrow(0, env.rank * rows, rows);
      y = y.narrow(0, env.rank * rows, rows);
      grads->prepare_for_backward(m == kMicroBatches - 1);
      auto loss = loss_on(net, x, y, mode.dtype) / double(kMicroBatches);
      if (m == kMicroBatches - 1 && s == mode.inf_step && env.rank == 0) loss = inject(loss);
      (scaler ? scaler->scale(loss) : loss).backward();
    }
    grads->finish_backward();
    overlapped.push_back(grads->launched_in_backward());
    shards->prepare_grads();
    if (scaler) scaler->unscale_(shards->optimizer());
    if (mode.max_grad_norm > 0) {
      const auto want = whole_grad_norm();
      const auto norm = shards->clip_grad_norm_(mode.max_grad_norm);
      norms.push_back(norm.item<double>());
      if (norm.scalar_type() != want.scalar_type() ||
          !torch::allclose(norm, want, 0, 0, /*equal_nan=*/true)) {
        std::ostringstream line;
        line << std::setprecision(9) << "step " << s << ": " << norm.item<double>() << " ("
             << norm.scalar_type() << ") vs " << want.item<double>() << " (" << want.scalar_type()
             << ")";
        unequal_norms.push_back(line.str());
      }
    }
    if (scaler) {
      scaler->step(shards->optimizer());
      scaler->update();
    } else {
      shards->optimizer().step();
    }
    shards->all_gather_params();
    shards->zero_grad();
  }

  torch::Tensor whole_grad_norm();
};

// What data parallel's clip_grad_norm_ measures: mantissa::get_total_norm over each
// parameter's whole averaged gradient (the shards all-gathered, each parameter copied out as
// a tensor of its own), in the optimizer's order. Call after prepare_grads, before clipping.
torch::Tensor Sharded::whole_grad_norm() {
  std::vector<torch::Tensor> full;
  const auto& buckets = flat->layout().buckets;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    auto grad = shards->shard_params()[b].grad();
    full.push_back(torch::empty({buckets[b].padded_numel}, grad.options()));
    group->_allgather_base(full.back(), grad)->wait();
  }
  std::vector<torch::Tensor> grads;
  for (std::size_t i = 0; i < flat->params().size(); ++i) {
    const auto [b, s] = flat->layout().where[i];
    const auto& slot = buckets[b].slots[s];
    grads.push_back(
        full[b].narrow(0, slot.offset, slot.numel).clone().view(flat->params()[i].sizes()));
  }
  return mantissa::get_total_norm(grads);
}

// A gradient element in rank 1's shard (so not in rank 0's), as (parameter index, element index).
std::pair<std::size_t, std::int64_t> element_outside_rank0(const sh::FlatParameters& flat) {
  for (const auto& bucket : flat.layout().buckets) {
    for (const auto& slot : bucket.slots) {
      if (auto piece = bucket.piece(slot, 1)) return {slot.param, piece->param_offset};
    }
  }
  throw std::runtime_error("rank 1's shard holds no parameter element");
}

// The parameter index in net->parameters() order of flat param `i`.
std::size_t net_index(Net& net, const torch::Tensor& p) {
  const auto params = net->parameters();
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (params[k].is_same(p)) return k;
  }
  throw std::runtime_error("not a parameter of the net");
}

// ---- scenarios -----------------------------------------------------------------------------

int compare_run(const std::string& scenario, Report& report) {
  const auto mode = mode_of(scenario);
  const auto env = dist::DistributedEnvironment::from_env();
  auto group = dist::init_process_group(env, dist::Backend::kGloo, std::chrono::seconds(60));
  Sharded run(mode, env, group);
  SingleProcess ref(mode);
  const std::int64_t steps = 5;

  // The element that gets the inf: found through the sharded layout, used by both runs.
  std::function<torch::Tensor(torch::Tensor)> inject_sharded, inject_ref;
  if (mode.inf_step >= 0) {
    // Named copies: clang refuses lambda captures of structured bindings in C++17.
    const auto target = element_outside_rank0(*run.flat);
    const auto param = target.first;
    const auto element = target.second;
    const auto k = net_index(run.net, run.flat->params()[param]);
    const auto inf = std::numeric_limits<double>::infinity();
    inject_sharded = [&run, k, element, inf](torch::Tensor loss) {
      return loss + run.net->parameters()[k].reshape({-1})[element].to(torch::kFloat) * inf;
    };
    inject_ref = [&ref, k, element, inf](torch::Tensor loss) {
      return loss + ref.net->parameters()[k].reshape({-1})[element].to(torch::kFloat) * inf;
    };
  }
  std::vector<torch::Tensor> before_inf;
  for (std::int64_t s = 0; s < steps; ++s) {
    if (s == mode.inf_step) {
      for (const auto& p : run.net->parameters()) before_inf.push_back(p.detach().clone());
    }
    run.step(s, inject_sharded);
    ref.step(s, inject_ref);
    if (s == mode.inf_step) {
      const auto params = run.net->parameters();
      bool same = true;
      for (std::size_t i = 0; i < params.size(); ++i)
        same &= torch::equal(params[i], before_inf[i]);
      report.expect(same, "the step with an inf in rank 1's shard was skipped on this rank too");
    }
  }

  // Weights: fp32 within 1e-6 of the largest weight, element by element; low precision within
  // what its rounding allows, as a whole.
  const bool fp32 = mode.dtype == torch::kFloat;
  const auto got = run.net->parameters();
  const auto want = ref.net->parameters();
  double worst = 0, worst_norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, rel_diff(got[i], want[i]));
    worst_norm = std::max(worst_norm, rel_norm_diff(got[i], want[i]));
  }
  if (fp32) {
    report.within(worst, 1e-6, "weights against one process, largest relative difference");
  } else {
    std::cout << "rank " << env.rank << ": largest element difference " << worst << std::endl;
    report.within(worst_norm, kLowPrecisionWeightTol,
                  "weights against one process, relative norm of the difference");
  }

  // Every rank must hold the same weights (all-gathered from the same shards).
  for (const auto& p : got) {
    auto copy = p.detach().to(torch::kFloat).clone();
    std::vector<torch::Tensor> t{copy};
    group->broadcast(t)->wait();
    if (!torch::equal(copy, p.detach().to(torch::kFloat))) {
      report.expect(false, "weights equal to rank 0's");
      break;
    }
  }

  if (mode.max_grad_norm > 0) {
    double norm_diff = 0;
    for (std::size_t s = 0; s < run.norms.size(); ++s) {
      if (!std::isfinite(ref.norms[s])) continue;  // the step with an inf: skipped by both
      norm_diff = std::max(norm_diff, std::abs(run.norms[s] - ref.norms[s]) / ref.norms[s]);
    }
    report.within(norm_diff, fp32 ? 1e-5 : 2e-2,
                  "global gradient norm from the shards against one process's");
    for (const auto& line : run.unequal_norms) {
      std::cout << "rank " << env.rank << ": " << line << std::endl;
    }
    report.expect(run.unequal_norms.empty(),
                  std::to_string(run.norms.size() - run.unequal_norms.size()) + " of " +
                      std::to_string(run.norms.size()) +
                      " global norms bitwise equal to get_total_norm over the whole gradients");
  }
  if (run.scaler) {
    report.expect(
        run.scaler->get_scale() == ref.scaler->get_scale(),
        "loss scale " + std::to_string(run.scaler->get_scale()) + " equal to one process's");
    report.expect(run.scaler->skipped_steps() == 1, "exactly one step skipped");
  }
  const std::size_t buckets = run.flat->layout().buckets.size();
  report.expect(buckets >= 3, std::to_string(buckets) + " buckets");
  report.expect(run.overlapped.back() == buckets,
                std::to_string(run.overlapped.back()) +
                    " reduce-scatters launched from the backward hooks, out of " +
                    std::to_string(buckets));

  // The gathered state: what the one process holds, in the same layout.
  const auto full = sh::gather_full_state(*run.shards);
  if (env.rank == 0) {
    std::vector<torch::Tensor> ref_tensors;
    for (const auto& p : run.flat->params()) {
      ref_tensors.push_back(ref.tensor_of(ref.net->parameters()[net_index(run.net, p)]));
    }
    const auto want_state = sh::state_of(*ref.optimizer, ref_tensors);
    report.expect(full.step.item<double>() == want_state.step.item<double>(),
                  "gathered step " + std::to_string(full.step.item<double>()));
    double m1 = 0, m2 = 0, masters = 0;
    for (std::size_t i = 0; i < ref_tensors.size(); ++i) {
      report.expect(full.exp_avg[i].sizes() == ref_tensors[i].sizes(),
                    "exp_avg of parameter " + std::to_string(i) + " in its parameter's shape");
      m1 = std::max(m1, rel_diff(full.exp_avg[i], want_state.exp_avg[i]));
      m2 = std::max(m2, rel_diff(full.exp_avg_sq[i], want_state.exp_avg_sq[i]));
      if (mode.masters) {
        masters = std::max(masters, rel_norm_diff(full.masters[i], ref_tensors[i]));
      }
    }
    const double state_tol = fp32 ? 1e-5 : 5e-2;
    report.within(m1, state_tol, "gathered exp_avg against one process's");
    report.within(m2, state_tol, "gathered exp_avg_sq against one process's");
    if (mode.masters) {
      report.within(masters, kLowPrecisionWeightTol, "gathered masters against one process's");
    }
    if (mode.rule == LowPrecisionUpdate::kKahan) {
      report.expect(full.kahan_comp.size() == ref_tensors.size() && full.kahan_comp[0].defined(),
                    "gathered kahan_comp for every parameter");
    }
  }

  // Memory: this rank's optimizer state against the one process's.
  const auto single_bytes =
      sh::fused_adamw_state_bytes(*ref.optimizer) + (ref.masters ? ref.masters->bytes() : 0);
  const auto sharded_bytes = run.shards->state_bytes();
  const auto& layout = run.flat->layout();
  // Every element of the padding costs what an element of a parameter costs; the 0-d steps
  // are counted once per tensor.
  std::int64_t numel = 0;
  for (const auto& p : run.flat->params()) numel += p.numel();
  const double bytes_per_element = double(single_bytes) / double(numel);
  const double allowed =
      bytes_per_element * double(layout.shard_numel()) + 8.0 * double(layout.buckets.size());
  std::cout << "rank " << env.rank << ": optimizer-state bytes " << sharded_bytes << " sharded, "
            << single_bytes << " in one process (" << layout.world_size << " ranks, "
            << layout.padding_numel() << " padding elements)" << std::endl;
  report.expect(double(sharded_bytes) <= allowed && sharded_bytes < single_bytes,
                "state bytes per rank at most 1/N of one process's plus padding (" +
                    std::to_string(sharded_bytes) + " <= " + std::to_string(allowed) + ")");
  group->barrier()->wait();
  return report.ok ? 0 : 1;
}

// Writes what a single-process checkpoint holds: weights, optimizer.pt, masters.pt.
void save_checkpoint(Sharded& run, const std::string& dir) {
  const auto full = sh::gather_full_state(*run.shards);
  if (run.env.rank != 0) return;
  mantissa::io::create_directories(dir);
  torch::save(run.net->parameters(), mantissa::io::join_path(dir, "weights.pt"));
  // The one-process objects the state belongs to, built as a one-process run builds them.
  SingleProcess shape(run.mode);
  {
    torch::NoGradGuard no_grad;
    auto params = shape.net->parameters();
    const auto ours = run.net->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(ours[i]);
  }
  std::vector<torch::Tensor> tensors;
  for (const auto& p : run.flat->params()) {
    tensors.push_back(shape.tensor_of(shape.net->parameters()[net_index(run.net, p)]));
  }
  if (shape.masters) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (full.masters[i].defined()) tensors[i].copy_(full.masters[i]);
    }
    torch::serialize::OutputArchive masters;
    shape.masters->save(masters);
    masters.save_to(mantissa::io::join_path(dir, "masters.pt"));
  }
  sh::put_state(*shape.optimizer, tensors, full);
  torch::serialize::OutputArchive archive;
  shape.optimizer->save(archive);
  archive.save_to(mantissa::io::join_path(dir, "optimizer.pt"));
}

// A one-process run resumed from `dir`, as the Trainer resumes one.
void load_single(SingleProcess& single, const std::string& dir) {
  std::vector<torch::Tensor> weights;
  torch::load(weights, mantissa::io::join_path(dir, "weights.pt"));
  {
    torch::NoGradGuard no_grad;
    auto params = single.net->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(weights[i]);
  }
  if (single.masters) {
    torch::serialize::InputArchive masters;
    masters.load_from(mantissa::io::join_path(dir, "masters.pt"));
    single.masters->load(masters);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(mantissa::io::join_path(dir, "optimizer.pt"));
  single.optimizer->load(archive);
}

int reshard_run(const std::string& scenario, int phase, const std::string& dir, Report& report) {
  const auto mode = mode_of(scenario);
  const auto env = dist::DistributedEnvironment::from_env();
  auto group = dist::init_process_group(env, dist::Backend::kGloo, std::chrono::seconds(60));
  const std::int64_t save_at = 3, steps = 6;
  const auto none = std::function<torch::Tensor(torch::Tensor)>();
  if (phase == 0) {  // train, save at step 3, go on to step 6
    Sharded run(mode, env, group);
    for (std::int64_t s = 0; s < steps; ++s) {
      if (s == save_at) save_checkpoint(run, dir);
      run.step(s, none);
    }
    if (env.rank == 0) torch::save(run.net->parameters(), mantissa::io::join_path(dir, "final.pt"));
    group->barrier()->wait();
    return 0;
  }
  // Resume at this world size: weights from the file, the state scattered from rank 0.
  std::vector<torch::Tensor> weights;
  torch::load(weights, mantissa::io::join_path(dir, "weights.pt"));
  Sharded run(mode, env, group, &weights);
  sh::FullOptimizerState state;
  if (env.rank == 0) {
    SingleProcess loaded(mode);
    load_single(loaded, dir);
    std::vector<torch::Tensor> tensors;
    for (const auto& p : run.flat->params()) {
      tensors.push_back(loaded.tensor_of(loaded.net->parameters()[net_index(run.net, p)]));
    }
    state = sh::state_of(*loaded.optimizer, tensors);
    if (loaded.masters) {
      for (const auto& t : tensors) state.masters.push_back(t.detach().clone());
    }
    if (scenario == "bad_state") state.exp_avg[1] = torch::zeros({3, 3});
  }
  if (scenario == "bad_state") {
    try {
      sh::scatter_full_state(*run.shards, state);
      report.expect(false, "a state for another model was refused");
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      std::cout << "rank " << env.rank << ": refused: " << what << std::endl;
      report.expect(what.find(env.rank == 0 ? "exp_avg of parameter 1 has shape" : "rank 0") !=
                        std::string::npos,
                    "the error names the cause");
    }
    return report.ok ? 0 : 1;
  }
  sh::scatter_full_state(*run.shards, state);
  for (std::int64_t s = save_at; s < steps; ++s) run.step(s, none);

  if (env.world_size == 2) {
    std::vector<torch::Tensor> final_weights;
    torch::load(final_weights, mantissa::io::join_path(dir, "final.pt"));
    const auto params = run.net->parameters();
    bool same = true;
    for (std::size_t i = 0; i < params.size(); ++i)
      same &= torch::equal(params[i], final_weights[i]);
    report.expect(same, "resumed at the same world size: bitwise equal to the run that went on");
  }
  SingleProcess single(mode);
  load_single(single, dir);
  for (std::int64_t s = save_at; s < steps; ++s) single.step(s, none);
  double worst = 0;
  const auto got = run.net->parameters();
  const auto want = single.net->parameters();
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, rel_diff(got[i], want[i]));
  report.within(worst, 1e-6,
                "resumed on " + std::to_string(env.world_size) +
                    " ranks against one process resuming the same files");
  group->barrier()->wait();
  return report.ok ? 0 : 1;
}

// The layout alone, in the launcher's process: sizes, order, padding and the shard pieces.
int check_layout() {
  Report report{0};
  const std::vector<sh::ParamSpec> specs = {{100, torch::kFloat, 0},
                                            {7, torch::kFloat, 1},
                                            {300, torch::kFloat, 0},
                                            {5, torch::kBFloat16, 0},
                                            {64, torch::kFloat, 0}};
  for (const std::int64_t world : {1, 2, 3, 8}) {
    const auto layout = sh::plan_flat_layout(specs, world, /*bucket_cap_bytes=*/1200);
    const std::string at = " (world " + std::to_string(world) + ")";
    // Reverse order; a new bucket at each change of group or dtype and past the cap.
    std::vector<std::size_t> order;
    for (const auto& bucket : layout.buckets) {
      for (const auto& slot : bucket.slots) order.push_back(slot.param);
    }
    report.expect(order == std::vector<std::size_t>({4, 3, 2, 1, 0}),
                  "parameters in reverse order" + at);
    report.expect(layout.buckets.size() == 5, std::to_string(layout.buckets.size()) +
                                                  " buckets: 64 | bf16 5 | 300 (cap) | "
                                                  "group 1 | 100" +
                                                  at);
    std::vector<std::int64_t> covered(specs.size(), 0);
    bool sizes_ok = true;
    for (const auto& bucket : layout.buckets) {
      const auto unit = world * sh::shard_alignment(bucket.dtype);
      sizes_ok &= bucket.padded_numel % unit == 0 && bucket.padded_numel >= bucket.numel &&
                  bucket.padded_numel - bucket.numel < unit &&
                  bucket.shard_numel * world == bucket.padded_numel;
      for (const auto& slot : bucket.slots) {
        sizes_ok &=
            specs[slot.param].group == bucket.group && specs[slot.param].dtype == bucket.dtype;
        std::int64_t next = 0;  // pieces in rank order tile the parameter
        for (std::int64_t r = 0; r < world; ++r) {
          if (auto piece = bucket.piece(slot, r)) {
            sizes_ok &= piece->param_offset == next && piece->shard_offset >= 0 &&
                        piece->shard_offset + piece->numel <= bucket.shard_numel;
            next += piece->numel;
          }
        }
        covered[slot.param] += next;
      }
    }
    report.expect(sizes_ok,
                  "padding below one unit of world * alignment, shards equal, slots "
                  "of one group and dtype, pieces tile each parameter" +
                      at);
    bool all_covered = true;
    for (std::size_t i = 0; i < specs.size(); ++i) all_covered &= covered[i] == specs[i].numel;
    report.expect(all_covered, "every element in exactly one shard" + at);
    // The split parameters (for the gradient norm): exactly those with pieces on two ranks or
    // more, their pieces as piece() gives them, each rank's packed pieces back to back.
    bool splits_ok = true;
    std::size_t split_count = 0;
    for (const auto& bucket : layout.buckets) {
      const auto split = sh::split_slots(bucket, world);
      std::vector<std::int64_t> packed(static_cast<std::size_t>(world), 0);
      std::size_t next = 0;
      for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
        const auto& slot = bucket.slots[s];
        std::int64_t ranks = 0;
        for (std::int64_t r = 0; r < world; ++r) ranks += bucket.piece(slot, r) ? 1 : 0;
        splits_ok &= bucket.is_split(slot) == (ranks > 1) &&
                     bucket.piece(slot, bucket.first_rank(slot))->param_offset == 0;
        if (ranks < 2) continue;
        ++split_count;
        splits_ok &= next < split.slots.size() && split.slots[next].slot == s &&
                     static_cast<std::int64_t>(split.slots[next].pieces.size()) == ranks;
        if (!splits_ok) break;
        for (const auto& part : split.slots[next].pieces) {
          const auto piece = bucket.piece(slot, part.rank);
          splits_ok &= piece && piece->param_offset == part.piece.param_offset &&
                       piece->shard_offset == part.piece.shard_offset &&
                       piece->numel == part.piece.numel &&
                       part.packed_offset == packed[static_cast<std::size_t>(part.rank)];
          packed[static_cast<std::size_t>(part.rank)] += part.piece.numel;
        }
        ++next;
      }
      splits_ok &= next == split.slots.size() &&
                   split.packed_numel == *std::max_element(packed.begin(), packed.end()) &&
                   split.packed_numel <= bucket.shard_numel;
    }
    report.expect(splits_ok && (world == 1) == (split_count == 0),
                  std::to_string(split_count) +
                      " parameters split across shards, their pieces packed per rank" + at);
    report.expect(layout.where[2] == std::make_pair(std::size_t{2}, std::size_t{0}),
                  "where[] finds parameter 2 in bucket 2" + at);
  }
  const auto refused = [&](const std::function<void()>& f, const std::string& words) {
    try {
      f();
    } catch (const c10::ValueError& e) {
      const std::string what = e.what_without_backtrace();
      report.expect(what.find(words) != std::string::npos, "refused: " + what);
      return;
    }
    report.expect(false, "refused (" + words + ")");
  };
  refused([&] { sh::plan_flat_layout(specs, 0, 1024); }, "world_size must be >= 1, but it is 0");
  refused(
      [&] {
        sh::plan_flat_layout({{4, torch::kFloat, 0}, {0, torch::kFloat, 0}}, 2, 1024);
      },
      "parameter 1 has no elements");
  refused([&] { sh::plan_flat_layout(specs, 2, 0); }, "bucket_cap_bytes must be >= 1");
  auto p = torch::zeros({3}, torch::requires_grad());
  refused(
      [&] {
        sh::FlatParameters({{p, p}}, 0, 2, 1024);
      },
      "parameter 1 of group 0 is listed twice");
  refused([&] { sh::FlatParameters({{p}}, 2, 2, 1024); }, "rank must be in [0, world_size)");
  // The parameter keeps its values and identity, and becomes a view of the buffer.
  auto a = torch::arange(6, torch::kFloat).reshape({2, 3}).requires_grad_();
  auto b = torch::full({5}, 7.f).requires_grad_();
  const auto* a_impl = a.unsafeGetTensorImpl();
  sh::FlatParameters flat({{a}, {b}}, 1, 2, 1024);
  report.expect(a.unsafeGetTensorImpl() == a_impl && a.requires_grad() &&
                    torch::equal(a, torch::arange(6, torch::kFloat).reshape({2, 3})),
                "a parameter keeps its identity, values and requires_grad");
  {
    torch::NoGradGuard no_grad;
    flat.buffer(flat.layout().where[0].first).fill_(-1);
  }
  report.expect(torch::equal(a, torch::full({2, 3}, -1.f)), "the parameter views its buffer");
  report.expect(flat.shard(0).numel() == flat.layout().buckets[0].shard_numel &&
                    flat.shard(0).data_ptr<float>() ==
                        flat.buffer(0).data_ptr<float>() + flat.layout().buckets[0].shard_numel,
                "rank 1's shard is the second half of the buffer");
  std::cout << "check: " << (report.ok ? "PASSED" : "FAILED") << std::endl;
  return report.ok ? 0 : 1;
}

// Rank 1 dies after its first step; rank 0, in its next collective, must fail, not hang.
int killed_rank(Report& report) {
  const auto env = dist::DistributedEnvironment::from_env();
  auto group = dist::init_process_group(env, dist::Backend::kGloo, std::chrono::seconds(30));
  Sharded run(mode_of("fp32"), env, group);
  const auto none = std::function<torch::Tensor(torch::Tensor)>();
  run.step(0, none);
  if (env.rank == 1) {
    std::cout << "rank 1 leaves without a word" << std::endl;
    std::_Exit(kDiedOnPurpose);
  }
  try {
    for (std::int64_t s = 1; s < 4; ++s) run.step(s, none);
  } catch (const std::exception& e) {
    std::cout << "rank 0: the collective failed as it should: " << e.what() << std::endl;
    return kNoticed;
  }
  report.expect(false, "rank 0 noticed that rank 1 died");
  return 1;
}

int run_rank(const std::string& scenario, int phase, const std::string& dir) {
  Report report{std::stoll(std::getenv("RANK") ? std::getenv("RANK") : "0")};
  at::set_num_threads(1);
  if (scenario == "reshard" || scenario == "bad_state") {
    return reshard_run(scenario, phase, dir, report);
  }
  if (scenario == "rank_killed") return killed_rank(report);
  return compare_run(scenario, report);
}

// ---- the launcher ------------------------------------------------------------------------

int launch_phase(const std::string& scenario, int phase, int world_size, const std::string& dir,
                 int deadline_s, const std::vector<int>& expected = {}) {
  namespace mt = mantissa::testing;
  const auto port = mt::free_port();
  std::cout << "launcher: " << scenario << " phase " << phase << ", " << world_size
            << " ranks on 127.0.0.1:" << port << std::endl;
  const auto base = mt::environment_without_launcher_variables();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world_size; ++rank) {
    auto env = base;
    for (const auto& kv : mt::rank_variables(rank, world_size, port)) env.push_back(kv);
    pids.push_back(mt::start_process(
        "/proc/self/exe",
        {"sharded_check", "rank", scenario, "--phase", std::to_string(phase), "--dir", dir}, env));
  }
  const auto status = mt::wait_for(pids, deadline_s);
  bool ok = true;
  for (int rank = 0; rank < world_size; ++rank) {
    std::cout << "launcher: rank " << rank << " exited with " << status[rank] << std::endl;
    ok &= status[rank] == (expected.empty() ? 0 : expected[rank]);
  }
  return ok ? 0 : 1;
}

int check(const std::string& scenario, int deadline_s) {
  // mantissa's own file helpers: the PyPI libtorch.so exports broken copies of some
  // std::filesystem functions (remove_all among them) that would win the symbol lookup.
  const char* tmp = std::getenv("TMPDIR");
  const auto dir = mantissa::io::make_temp_directory(tmp != nullptr ? tmp : "/tmp",
                                                     "sharded_check_" + scenario + "_");
  bool ok = true;
  if (scenario == "reshard") {
    ok = launch_phase(scenario, 0, 2, dir, deadline_s) == 0;
    for (int world : {2, 3, 1}) ok = ok && launch_phase(scenario, 1, world, dir, deadline_s) == 0;
  } else if (scenario == "bad_state") {
    ok = launch_phase(scenario, 0, 2, dir, deadline_s) == 0 &&
         launch_phase(scenario, 1, 2, dir, deadline_s) == 0;
  } else if (scenario == "rank_killed") {
    ok = launch_phase(scenario, 0, 2, dir, deadline_s, {kNoticed, kDiedOnPurpose}) == 0;
  } else {
    mode_of(scenario);  // an unknown name fails here, before any process starts
    ok = launch_phase(scenario, 0, 2, dir, deadline_s) == 0;
  }
  mantissa::io::remove_all(dir);
  std::cout << "check: " << (ok ? "PASSED" : "FAILED") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto option = [&](const std::string& name, const std::string& fallback) {
    for (std::size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == name) return args[i + 1];
    }
    return fallback;
  };
  try {
    if (args.size() >= 2 && args[0] == "rank") {
      return run_rank(args[1], std::stoi(option("--phase", "0")), option("--dir", "."));
    }
    if (args.size() >= 2 && args[0] == "check" && args[1] == "layout") return check_layout();
    if (args.size() >= 2 && args[0] == "check") {
      return check(args[1], std::stoi(option("--deadline-s", "120")));
    }
    std::cerr << "usage: sharded_check check <scenario> [--deadline-s S] | rank <scenario> "
                 "--phase P --dir D"
              << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
}
