#include "trainer/sharded/full_state.h"

#include <array>
#include <exception>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <mantissa/amp/master_weights.h>

namespace mantissa::detail::sharded {
namespace {

using optim::FusedAdamWOptions;
using optim::FusedAdamWParamState;

using Kind = StateKind;
constexpr auto kKinds = kStateKinds;

std::vector<at::Tensor>& field(FullOptimizerState& state, Kind kind) {
  switch (kind) {
    case Kind::kExpAvg:
      return state.exp_avg;
    case Kind::kExpAvgSq:
      return state.exp_avg_sq;
    case Kind::kMaxExpAvgSq:
      return state.max_exp_avg_sq;
    case Kind::kKahanComp:
      return state.kahan_comp;
    case Kind::kMaster:
      break;
  }
  return state.masters;
}

const std::vector<at::Tensor>& field(const FullOptimizerState& state, Kind kind) {
  return field(const_cast<FullOptimizerState&>(state), kind);  // the same member, read only
}

const char* name_of(Kind kind) { return state_kind_name(kind); }

const FusedAdamWParamState* state_for(const optim::FusedAdamW& optimizer, const at::Tensor& t) {
  const auto it = optimizer.state().find(t.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<const FusedAdamWParamState*>(it->second.get());
}

at::Tensor tensor_of(const FusedAdamWParamState& s, Kind kind) {
  switch (kind) {
    case Kind::kExpAvg:
      return s.exp_avg();
    case Kind::kExpAvgSq:
      return s.exp_avg_sq();
    case Kind::kMaxExpAvgSq:
      return s.max_exp_avg_sq();
    case Kind::kKahanComp:
      return s.kahan_comp();
    case Kind::kMaster:
      break;
  }
  return {};
}

at::Tensor local_shard(const ShardedAdamW& shards, std::size_t b, Kind kind) {
  return local_state_shard(shards, b, kind);
}

const FusedAdamWOptions& options_of(const ShardedAdamW& shards, std::size_t b) {
  const auto group = shards.flat().layout().buckets[b].group;
  return static_cast<const FusedAdamWOptions&>(
      shards.optimizer().param_groups().at(group).options());
}

// `shapes` are the parameters' own shapes, which a released parameter (full sharding) no
// longer shows.
void check_state_shapes(const FullOptimizerState& state,
                        const std::vector<std::vector<std::int64_t>>& shapes, const char* where) {
  const auto n = shapes.size();
  for (const auto kind : kKinds) {
    const auto& tensors = field(state, kind);
    const bool required = !state.empty() && (kind == Kind::kExpAvg || kind == Kind::kExpAvgSq);
    TORCH_CHECK_VALUE(tensors.size() == n || (tensors.empty() && !required), where,
                      ": the state holds ", tensors.size(), " ", name_of(kind),
                      " tensors, this model has ", n, " parameters");
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i].defined()) {
        TORCH_CHECK_VALUE(!required, where, ": ", name_of(kind), " of parameter ", i,
                          " is missing");
        continue;
      }
      TORCH_CHECK_VALUE(tensors[i].numel() == c10::multiply_integers(shapes[i]), where, ": ",
                        name_of(kind), " of parameter ", i, " has shape ", tensors[i].sizes(),
                        ", the parameter has shape ", at::IntArrayRef(shapes[i]));
    }
  }
}

}  // namespace

const char* state_kind_name(StateKind kind) {
  switch (kind) {
    case StateKind::kExpAvg:
      return "exp_avg";
    case StateKind::kExpAvgSq:
      return "exp_avg_sq";
    case StateKind::kMaxExpAvgSq:
      return "max_exp_avg_sq";
    case StateKind::kKahanComp:
      return "kahan_comp";
    case StateKind::kMaster:
      break;
  }
  return "master";
}

at::Tensor local_state_shard(const ShardedAdamW& shards, std::size_t b, StateKind kind) {
  const auto& p = shards.shard_params()[b];
  if (kind == StateKind::kMaster) return shards.has_master(b) ? p : at::Tensor();
  const auto* s = state_for(shards.optimizer(), p);
  return s != nullptr ? tensor_of(*s, kind) : at::Tensor();
}

at::Tensor local_step(const ShardedAdamW& shards, std::size_t b) {
  const auto* s = state_for(shards.optimizer(), shards.shard_params()[b]);
  return s != nullptr ? s->step() : at::Tensor();
}

void restore_bucket_state(ShardedAdamW& shards, std::size_t b, const at::Tensor& step,
                          const std::function<bool(StateKind, at::Tensor&)>& fill) {
  at::NoGradGuard no_grad;
  const auto& p = shards.shard_params()[b];
  if (shards.has_master(b)) {
    auto master = p;
    if (!fill(Kind::kMaster, master)) master.copy_(shards.flat().shard(b));
  }
  auto& optimizer = shards.optimizer();
  optimizer.state().erase(p.unsafeGetTensorImpl());
  if (!step.defined()) return;
  const auto& options = options_of(shards, b);
  const auto moments = p.options().dtype(
      options.fp32_moments() && amp::is_low_precision(p.scalar_type()) ? at::kFloat
                                                                       : p.scalar_type());
  auto fresh = std::make_unique<FusedAdamWParamState>();
  fresh->step(step.to(p.device()).to(at::kFloat).reshape({}).clone());
  auto exp_avg = at::zeros_like(p, moments);
  auto exp_avg_sq = at::zeros_like(p, moments);
  TORCH_CHECK(fill(Kind::kExpAvg, exp_avg) && fill(Kind::kExpAvgSq, exp_avg_sq),
              "restore_bucket_state: bucket ", b, " has a step but no moments");
  fresh->exp_avg(exp_avg);
  fresh->exp_avg_sq(exp_avg_sq);
  if (options.amsgrad()) {
    auto max = at::zeros_like(p, moments);
    fill(Kind::kMaxExpAvgSq, max);
    fresh->max_exp_avg_sq(max);
  }
  if (amp::is_low_precision(p.scalar_type()) &&
      options.low_precision_update() == optim::LowPrecisionUpdate::kKahan) {
    auto kahan = at::zeros_like(p);
    if (fill(Kind::kKahanComp, kahan)) fresh->kahan_comp(kahan);
  }
  optimizer.state()[p.unsafeGetTensorImpl()] = std::move(fresh);
}

FullOptimizerState gather_full_state(const ShardedAdamW& shards) {
  const auto& flat = shards.flat();
  const auto& layout = flat.layout();
  const auto& params = flat.params();
  const bool root = flat.rank() == 0;
  const auto world = flat.world_size();
  const auto& group = shards.group();
  FullOptimizerState full;
  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    const auto& bucket = layout.buckets[b];
    if (root && !full.step.defined()) {
      if (const auto* s = state_for(shards.optimizer(), shards.shard_params()[b])) {
        full.step = s->step().clone();
      }
    }
    for (const auto kind : kKinds) {
      // Every rank holds the same kinds: the options and the steps taken are the same.
      const auto local = local_shard(shards, b, kind);
      if (!local.defined()) continue;
      at::Tensor whole;
      std::vector<std::vector<at::Tensor>> outputs;
      if (root) {
        whole = at::empty({bucket.padded_numel}, local.options());
        outputs.push_back(whole.chunk(world));
      }
      std::vector<at::Tensor> inputs{local.contiguous()};
      c10d::GatherOptions options;
      options.rootRank = 0;
      group->gather(outputs, inputs, options)->wait();
      if (!root) continue;
      auto& out = field(full, kind);
      out.resize(params.size());
      for (const auto& slot : bucket.slots) {
        out[slot.param] =
            whole.narrow(0, slot.offset, slot.numel).view(flat.shape(slot.param)).clone();
      }
    }
  }
  return full;
}

void scatter_full_state(ShardedAdamW& shards, const FullOptimizerState& state) {
  const auto& flat = shards.flat();
  const auto& layout = flat.layout();
  const auto& params = flat.params();
  const bool root = flat.rank() == 0;
  const auto world = flat.world_size();
  auto group = shards.group();
  const auto device = params.front().device();
  at::NoGradGuard no_grad;

  // Rank 0 checks what it was given and tells everyone, before the first scatter.
  std::exception_ptr failure;
  auto header = at::zeros({5}, at::TensorOptions().dtype(at::kLong).device(device));
  auto step = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  if (root) {
    try {
      std::vector<std::vector<std::int64_t>> shapes;
      for (std::size_t i = 0; i < params.size(); ++i) shapes.push_back(flat.shape(i));
      check_state_shapes(state, shapes, "scatter_full_state");
      header.copy_(
          at::tensor({1L, state.empty() ? 0L : 1L, state.max_exp_avg_sq.empty() ? 0L : 1L,
                      state.kahan_comp.empty() ? 0L : 1L, state.masters.empty() ? 0L : 1L}));
      if (!state.empty()) step.copy_(state.step.reshape({1}));
    } catch (...) {
      failure = std::current_exception();
      header.zero_();
    }
  }
  std::vector<at::Tensor> announce{header, step};
  for (auto& t : announce) {
    std::vector<at::Tensor> one{t};
    group->broadcast(one)->wait();
  }
  if (failure != nullptr) std::rethrow_exception(failure);
  const auto flags = header.cpu();
  TORCH_CHECK(flags[0].item<std::int64_t>() == 1,
              "scatter_full_state: rank 0 could not use the optimizer state it loaded (its own "
              "error names the cause); rank ",
              flat.rank(), " stops with it");
  const bool has_state = flags[1].item<std::int64_t>() == 1;
  const bool has_max = flags[2].item<std::int64_t>() == 1;
  const bool has_kahan = flags[3].item<std::int64_t>() == 1;
  const bool has_masters = flags[4].item<std::int64_t>() == 1;

  // Cuts rank 0's per-parameter `source` into this bucket's shards; `into` gets this rank's.
  const auto scatter_into = [&](std::size_t b, const std::vector<at::Tensor>* source,
                                at::Tensor& into) {
    const auto& bucket = layout.buckets[b];
    std::vector<std::vector<at::Tensor>> inputs;
    if (root) {
      auto whole = at::zeros({bucket.padded_numel}, into.options());
      for (const auto& slot : bucket.slots) {
        const auto& src = (*source)[slot.param];
        if (src.defined()) whole.narrow(0, slot.offset, slot.numel).copy_(src.reshape({-1}));
      }
      std::vector<at::Tensor> chunks;
      for (auto& c : whole.chunk(world)) chunks.push_back(c.contiguous());
      inputs.push_back(std::move(chunks));
    }
    std::vector<at::Tensor> outputs{into};
    c10d::ScatterOptions options;
    options.rootRank = 0;
    group->scatter(outputs, inputs, options)->wait();
  };

  const auto saved_step = has_state ? step.reshape({}) : at::Tensor();
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    // Every rank takes part in the same scatters: each kind's presence is rank 0's to say.
    restore_bucket_state(shards, b, saved_step, [&](Kind kind, at::Tensor& into) {
      const bool present = kind == Kind::kMaster        ? has_masters
                           : kind == Kind::kMaxExpAvgSq ? has_max
                           : kind == Kind::kKahanComp   ? has_kahan
                                                        : has_state;
      if (present) scatter_into(b, &field(state, kind), into);
      return present;
    });
  }
}

FullOptimizerState state_of(const optim::FusedAdamW& optimizer,
                            const std::vector<at::Tensor>& tensors) {
  FullOptimizerState full;
  std::size_t with_state = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto* s = state_for(optimizer, tensors[i]);
    if (s == nullptr) continue;
    ++with_state;
    if (!full.step.defined()) full.step = s->step().detach().clone();
    TORCH_CHECK_VALUE(at::equal(s->step().cpu(), full.step.cpu()), "state_of: parameter ", i,
                      " has taken ", s->step().item<double>(), " steps, parameter 0 ",
                      full.step.item<double>(), "; a sharded run steps every parameter together");
    for (const auto kind : {Kind::kExpAvg, Kind::kExpAvgSq, Kind::kMaxExpAvgSq, Kind::kKahanComp}) {
      const auto t = tensor_of(*s, kind);
      if (!t.defined()) continue;
      auto& out = field(full, kind);
      out.resize(tensors.size());
      out[i] = t.detach();
    }
  }
  TORCH_CHECK_VALUE(with_state == 0 || with_state == tensors.size(), "state_of: ", with_state,
                    " of ", tensors.size(),
                    " parameters have optimizer state; a sharded run needs all or none");
  return full;
}

void put_state(optim::FusedAdamW& optimizer, const std::vector<at::Tensor>& tensors,
               const FullOptimizerState& state) {
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& t : tensors) shapes.push_back(t.sizes().vec());
  check_state_shapes(state, shapes, "put_state");
  for (const auto& t : tensors) optimizer.state().erase(t.unsafeGetTensorImpl());
  if (state.empty()) return;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    const auto on = [&](const at::Tensor& x) { return x.to(t.device()).view(t.sizes()).clone(); };
    auto fresh = std::make_unique<FusedAdamWParamState>();
    fresh->step(state.step.to(t.device()).reshape({}).clone());
    fresh->exp_avg(on(state.exp_avg[i]));
    fresh->exp_avg_sq(on(state.exp_avg_sq[i]));
    if (!state.max_exp_avg_sq.empty() && state.max_exp_avg_sq[i].defined()) {
      fresh->max_exp_avg_sq(on(state.max_exp_avg_sq[i]));
    }
    if (!state.kahan_comp.empty() && state.kahan_comp[i].defined()) {
      fresh->kahan_comp(on(state.kahan_comp[i]));
    }
    optimizer.state()[t.unsafeGetTensorImpl()] = std::move(fresh);
  }
}

}  // namespace mantissa::detail::sharded
