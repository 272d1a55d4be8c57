// AdamW8bit's step, its block-wise quantisation and its archives. The fp32 arithmetic follows
// torchao's single_param_adam in its order of operations, with lr and the step count held in
// fp32 0-d tensors as torchao holds them.
#include <mantissa/optim/adamw_8bit.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>

#include <mantissa/amp/master_weights.h>

#include "optim/low_precision_write.h"

namespace mantissa::optim {
namespace {

constexpr int64_t kMinQuantisedNumel = 4096;

void check_options(const AdamW8bitOptions& o) {
  const auto [beta1, beta2] = o.betas();
  TORCH_CHECK_VALUE(o.lr() >= 0, "AdamW8bit: invalid learning rate: ", o.lr());
  TORCH_CHECK_VALUE(o.eps() >= 0, "AdamW8bit: invalid epsilon value: ", o.eps());
  TORCH_CHECK_VALUE(beta1 >= 0 && beta1 < 1,
                    "AdamW8bit: invalid beta parameter at index 0: ", beta1);
  TORCH_CHECK_VALUE(beta2 >= 0 && beta2 < 1,
                    "AdamW8bit: invalid beta parameter at index 1: ", beta2);
  TORCH_CHECK_VALUE(o.weight_decay() >= 0,
                    "AdamW8bit: invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK_VALUE(o.block_size() >= 1, "AdamW8bit: block_size must be at least 1, got ",
                    o.block_size());
}

// The two maps, built once; `on` copies them to a device.
const at::Tensor& cpu_qmap(bool is_signed) {
  static const at::Tensor signed_map = adamw8bit_qmap(true);
  static const at::Tensor unsigned_map = adamw8bit_qmap(false);
  return is_signed ? signed_map : unsigned_map;
}

bool quantised_for(const at::Tensor& p, int64_t block_size) {
  return p.numel() >= kMinQuantisedNumel && p.numel() % block_size == 0;
}

// The code of `x` (already divided by its block's scale) in the sorted 256-entry `qmap`: the
// largest code whose value is <= x (0 below the map and for NaN, as torchao's halving search
// gives), then moved up one where x is at least halfway to the next value.
//
// `start` maps the upper 16 bits of a float (its bf16 bucket) to the code of the smallest value
// in that bucket, so that only the map values inside the bucket remain to be stepped over (at
// most a few near zero, where the map is densest).
struct CodeFinder {
  const float* qmap;
  std::vector<uint8_t> start;

  explicit CodeFinder(const float* map) : qmap(map), start(size_t{1} << 16) {
    for (uint32_t bucket = 0; bucket < (1u << 16); ++bucket) {
      // The smallest value of the bucket: its low bits zero if positive, all ones if negative.
      const uint32_t bits = (bucket << 16) | ((bucket & 0x8000u) != 0 ? 0xFFFFu : 0u);
      float lowest;
      std::memcpy(&lowest, &bits, sizeof lowest);
      int code = 0;
      for (int step = 128; step >= 1; step /= 2) {
        if (lowest >= qmap[code + step]) code += step;
      }
      start[bucket] = static_cast<uint8_t>(code);
    }
  }

  uint8_t operator()(float x) const {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    int code = start[bits >> 16];
    while (code < 255 && x >= qmap[code + 1]) ++code;
    const int up = code < 255 ? code + 1 : 255;
    const float down_value = qmap[code];
    const float up_value = qmap[up];
    return static_cast<uint8_t>(x - down_value >= (up_value - down_value) * 0.5f ? up : code);
  }
};

const CodeFinder& code_finder(bool is_signed) {
  static const CodeFinder signed_finder(cpu_qmap(true).const_data_ptr<float>());
  static const CodeFinder unsigned_finder(cpu_qmap(false).const_data_ptr<float>());
  return is_signed ? signed_finder : unsigned_finder;
}

// `values` (fp32) as codes of `qmap` and per-block scales (the block's largest magnitude), each
// value rounded to the nearer of the two codes around it (ties up). No device sync.
std::pair<at::Tensor, at::Tensor> quantise(const at::Tensor& values, bool is_signed,
                                           const at::Tensor& qmap, int64_t block_size) {
  auto blocks = values.reshape({-1, block_size});
  auto scale = blocks.abs().amax(-1).clamp_min(1e-12);
  if (values.is_cpu()) {
    // One pass per block; ATen's search over the map takes ~100x longer on the CPU.
    const auto flat = values.contiguous();
    auto codes = at::empty(values.sizes(), values.options().dtype(at::kByte));
    const float* in = flat.const_data_ptr<float>();
    const float* scales = scale.const_data_ptr<float>();
    const auto& code_of = code_finder(is_signed);
    uint8_t* out = codes.mutable_data_ptr<uint8_t>();
    at::parallel_for(0, scale.numel(), 16, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t i = b * block_size; i < (b + 1) * block_size; ++i) {
          out[i] = code_of(in[i] / scales[b]);
        }
      }
    });
    return {codes, scale};
  }
  auto scaled = (blocks / scale.view({-1, 1})).view(values.sizes());
  auto down =
      at::searchsorted(qmap, scaled, /*out_int32=*/false, /*right=*/true).sub_(1).clamp_(0, 255);
  auto up = (down + 1).clamp_max_(255);
  auto down_value = qmap.index({down});
  auto up_value = qmap.index({up});
  auto codes = at::where((scaled - down_value) >= (up_value - down_value) * 0.5, up, down);
  return {codes.to(at::kByte), scale};
}

at::Tensor dequantise(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& qmap) {
  if (codes.is_cpu()) {
    auto out = at::empty(codes.sizes(), scale.options());
    const auto flat = codes.contiguous();
    const uint8_t* in = flat.const_data_ptr<uint8_t>();
    const float* scales = scale.const_data_ptr<float>();
    const float* map = qmap.const_data_ptr<float>();
    float* values = out.mutable_data_ptr<float>();
    const int64_t block_size = codes.numel() / scale.numel();
    at::parallel_for(0, scale.numel(), 16, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t i = b * block_size; i < (b + 1) * block_size; ++i) {
          values[i] = map[in[i]] * scales[b];
        }
      }
    });
    return out;
  }
  return (qmap.index({codes.to(at::kInt)}).view({scale.size(0), -1}) * scale.view({-1, 1}))
      .view(codes.sizes());
}

AdamW8bitParamState fresh_state(const at::Tensor& p, int64_t block_size) {
  AdamW8bitParamState state;
  state.step(at::zeros({}, p.options().dtype(at::kFloat).requires_grad(false)));
  if (quantised_for(p, block_size)) {
    const auto codes = p.options().dtype(at::kByte).requires_grad(false);
    const auto scales = p.options().dtype(at::kFloat).requires_grad(false);
    state.exp_avg_codes(at::zeros(p.sizes(), codes));
    state.exp_avg_scale(at::zeros({p.numel() / block_size}, scales));
    state.exp_avg_sq_codes(at::zeros(p.sizes(), codes));
    state.exp_avg_sq_scale(at::zeros({p.numel() / block_size}, scales));
  } else {
    state.exp_avg(at::zeros_like(p, p.options().requires_grad(false)));
    state.exp_avg_sq(at::zeros_like(p, p.options().requires_grad(false)));
  }
  return state;
}

}  // namespace

at::Tensor adamw8bit_qmap(bool is_signed) {
  // Seven decades 1e-6 .. 1: decade i holds 2^i (signed, each sign) or 2^(i+1) (unsigned)
  // midpoints of an even split of [0.1, 1], scaled by 10^(i-6); then 0 and 1.
  std::vector<at::Tensor> parts;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    const auto bounds = at::linspace(0.1, 1.0, items, at::kFloat);
    const auto means = (bounds.slice(0, 0, items - 1) + bounds.slice(0, 1, items)) / 2.0;
    const double decade = std::pow(10.0, i - 6);
    parts.push_back(means * decade);
    if (is_signed) parts.push_back(means * -decade);
  }
  parts.push_back(at::zeros({1}, at::kFloat));
  parts.push_back(at::ones({1}, at::kFloat));
  auto map = std::get<0>(at::cat(parts).sort());
  TORCH_INTERNAL_ASSERT(map.numel() == 256, "the 8-bit map has ", map.numel(), " entries");
  return map;
}

AdamW8bitOptions::AdamW8bitOptions(double lr) : lr_(lr) {}

void AdamW8bitOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("betas", c10::IValue(betas()));
  archive.write("eps", c10::IValue(eps()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("block_size", c10::IValue(block_size()));
}

void AdamW8bitOptions::serialize(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* key) {
    c10::IValue value;
    TORCH_CHECK_VALUE(archive.try_read(key, value), "AdamW8bit options: the archive has no '", key,
                      "'");
    return value;
  };
  lr(read("lr").toDouble());
  betas(read("betas").to<betas_t>());
  eps(read("eps").toDouble());
  weight_decay(read("weight_decay").toDouble());
  block_size(read("block_size").toInt());
}

double AdamW8bitOptions::get_lr() const { return lr(); }
void AdamW8bitOptions::set_lr(const double lr) { this->lr(lr); }

void AdamW8bitParamState::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("step", step().defined() ? step() : at::zeros({}, at::kFloat));
  for (const auto& [key, t] :
       {std::pair<const char*, const at::Tensor&>{"exp_avg_codes", exp_avg_codes()},
        {"exp_avg_scale", exp_avg_scale()},
        {"exp_avg_sq_codes", exp_avg_sq_codes()},
        {"exp_avg_sq_scale", exp_avg_sq_scale()},
        {"exp_avg", exp_avg()},
        {"exp_avg_sq", exp_avg_sq()},
        {"kahan_comp", kahan_comp()}}) {
    if (t.defined()) archive.write(key, t);
  }
}

void AdamW8bitParamState::serialize(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  TORCH_CHECK_VALUE(archive.try_read("step", value), "AdamW8bit state: the archive has no 'step'");
  step(value.isTensor() ? value.toTensor().to(at::kFloat).reshape({})
                        : at::full({}, static_cast<double>(value.toInt()), at::kFloat));
  auto read_tensor = [&](const char* key) {
    c10::IValue tensor;
    return archive.try_read(key, tensor) ? tensor.toTensor() : at::Tensor();
  };
  exp_avg_codes(read_tensor("exp_avg_codes"));
  exp_avg_scale(read_tensor("exp_avg_scale"));
  exp_avg_sq_codes(read_tensor("exp_avg_sq_codes"));
  exp_avg_sq_scale(read_tensor("exp_avg_sq_scale"));
  exp_avg(read_tensor("exp_avg"));
  exp_avg_sq(read_tensor("exp_avg_sq"));
  kahan_comp(read_tensor("kahan_comp"));
}

AdamW8bit::AdamW8bit(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     AdamW8bitOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<AdamW8bitOptions>(defaults)) {
  check_options(defaults);
  for (const auto& group : param_groups_) {
    check_options(static_cast<const AdamW8bitOptions&>(group.options()));
  }
}

AdamW8bit::AdamW8bit(std::vector<at::Tensor> params, AdamW8bitOptions defaults)
    : AdamW8bit({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

at::Tensor AdamW8bit::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_mode(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  std::uint32_t index = 0;  // over all groups: the key of stochastic rounding, as FusedAdamW's
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const AdamW8bitOptions&>(group.options());
    const auto [beta1, beta2] = o.betas();
    for (auto& p : group.params()) {
      const auto tensor_index = rounding_index(index++);
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "AdamW8bit does not take sparse gradients");
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) slot = std::make_unique<AdamW8bitParamState>(fresh_state(p, o.block_size()));
      auto& state = static_cast<AdamW8bitParamState&>(*slot);
      const bool quantised = state.exp_avg_codes().defined();
      state.step().add_(1);

      const auto fp32 = p.options().dtype(at::kFloat).requires_grad(false);
      const auto lr = at::scalar_tensor(o.lr(), fp32);
      auto p32 = p.to(at::kFloat);
      const auto g32 = p.grad().to(at::kFloat);
      p32 = p32 - lr * o.weight_decay() * p32;
      const auto bias_correction1 = 1 - at::pow(beta1, state.step());
      const auto bias_correction2 = 1 - at::pow(beta2, state.step());
      const auto device_map = [&](bool is_signed) { return cpu_qmap(is_signed).to(p.device()); };
      const auto signed_map = quantised ? device_map(true) : at::Tensor();
      const auto unsigned_map = quantised ? device_map(false) : at::Tensor();
      const auto m_old = quantised
                             ? dequantise(state.exp_avg_codes(), state.exp_avg_scale(), signed_map)
                             : state.exp_avg().to(at::kFloat);
      const auto v_old =
          quantised ? dequantise(state.exp_avg_sq_codes(), state.exp_avg_sq_scale(), unsigned_map)
                    : state.exp_avg_sq().to(at::kFloat);
      const auto m = m_old.lerp(g32, 1 - beta1);
      const auto v = v_old.lerp(g32.square(), 1 - beta2);
      if (quantised) {
        auto [m_codes, m_scale] = quantise(m, /*is_signed=*/true, signed_map, o.block_size());
        auto [v_codes, v_scale] = quantise(v, /*is_signed=*/false, unsigned_map, o.block_size());
        state.exp_avg_codes().copy_(m_codes);
        state.exp_avg_scale().copy_(m_scale);
        state.exp_avg_sq_codes().copy_(v_codes);
        state.exp_avg_sq_scale().copy_(v_scale);
      } else {
        state.exp_avg().copy_(m);
        state.exp_avg_sq().copy_(v);
      }
      const auto denom = v.sqrt() / bias_correction2.sqrt() + o.eps();
      p32 = p32 - lr * (m / bias_correction1) / denom;
      if (!amp::is_low_precision(p.scalar_type())) {
        p.copy_(p32);
        continue;
      }
      // The step count keys stochastic rounding's bits (a sync on a GPU, whose write goes
      // through the host anyway).
      const auto step = low_precision_update() == LowPrecisionUpdate::kStochasticRounding
                            ? static_cast<std::uint32_t>(state.step().item<float>())
                            : 0u;
      detail::write_low_precision_(p, p32, low_precision_update(), state.kahan_comp(),
                                   {stochastic_rounding_seed(), tensor_index, step}, "AdamW8bit");
    }
  }
  return loss;
}

void AdamW8bit::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdamW8bitParamState, AdamW8bitOptions>(archive, *this);
}

void AdamW8bit::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<AdamW8bitParamState, AdamW8bitOptions>(archive, *this);
  std::size_t index = 0;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const AdamW8bitOptions&>(group.options());
    for (auto& p : group.params()) {
      const auto position = index++;
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it == state_.end()) continue;
      auto& state = static_cast<AdamW8bitParamState&>(*it->second);
      const bool quantised = quantised_for(p, o.block_size());
      const auto on = p.options().requires_grad(false);
      auto fit = [&](const char* name, const at::Tensor& t, bool wanted, at::IntArrayRef shape,
                     c10::ScalarType dtype) -> at::Tensor {
        TORCH_CHECK_VALUE(
            t.defined() == wanted, "the state of parameter ", position, " (", p.numel(),
            " elements, block_size ", o.block_size(), ") ", wanted ? "lacks" : "has", " '", name,
            "'", quantised ? " (its moments are quantised)" : " (its moments are not quantised)");
        if (!t.defined()) return t;
        TORCH_CHECK_VALUE(t.sizes() == shape, "the state '", name, "' of parameter ", position,
                          " has shape ", t.sizes(), " but ", shape, " was expected");
        const bool dtype_ok =
            dtype == at::kByte ? t.scalar_type() == at::kByte : at::isFloatingType(t.scalar_type());
        TORCH_CHECK_VALUE(dtype_ok, "the state '", name, "' of parameter ", position, " is ",
                          t.scalar_type(), ", not ",
                          dtype == at::kByte ? "uint8 codes" : "a floating-point tensor");
        return t.to(on.dtype(dtype));
      };
      const std::vector<int64_t> blocks{quantised ? p.numel() / o.block_size() : 0};
      state.step(state.step().to(on.dtype(at::kFloat)));
      state.exp_avg_codes(
          fit("exp_avg_codes", state.exp_avg_codes(), quantised, p.sizes(), at::kByte));
      state.exp_avg_scale(
          fit("exp_avg_scale", state.exp_avg_scale(), quantised, blocks, at::kFloat));
      state.exp_avg_sq_codes(
          fit("exp_avg_sq_codes", state.exp_avg_sq_codes(), quantised, p.sizes(), at::kByte));
      state.exp_avg_sq_scale(
          fit("exp_avg_sq_scale", state.exp_avg_sq_scale(), quantised, blocks, at::kFloat));
      state.exp_avg(fit("exp_avg", state.exp_avg(), !quantised, p.sizes(), p.scalar_type()));
      state.exp_avg_sq(
          fit("exp_avg_sq", state.exp_avg_sq(), !quantised, p.sizes(), p.scalar_type()));
      if (state.kahan_comp().defined()) {
        state.kahan_comp(
            fit("kahan_comp", state.kahan_comp(), true, p.sizes(), p.scalar_type()).contiguous());
      }
    }
  }
}

}  // namespace mantissa::optim
