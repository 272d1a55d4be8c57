#include "optim/low_precision_write.h"

#include <ATen/Parallel.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <mantissa/amp/master_weights.h>

#include "optim/low_precision_rounding.h"
#ifdef MANTISSA_WITH_CUDA
#include "optim/low_precision_write_cuda.h"
#endif

namespace mantissa::optim::detail {
namespace {

// Elements per task: enough that the Philox draws outweigh the task's start.
constexpr std::int64_t kGrain = 1 << 15;

template <bool kBf16>
void write_elements(std::uint16_t* param, const float* target, std::uint16_t* comp,
                    LowPrecisionUpdate rule, const RoundingKey& key, std::int64_t numel) {
  at::parallel_for(0, numel, kGrain, [&](std::int64_t begin, std::int64_t end) {
    if (rule == LowPrecisionUpdate::kKahan) {
      for (std::int64_t i = begin; i < end; ++i) {
        std::uint16_t c = comp[i];
        param[i] = kahan_write<kBf16>(widen<kBf16>(param[i]), target[i], &c);
        comp[i] = c;
      }
    } else {
      for (std::int64_t i = begin; i < end; ++i) {
        const auto bits =
            rounding_bits(key.seed, key.tensor, key.step, static_cast<std::uint64_t>(i));
        param[i] = round_stochastic<kBf16>(target[i], bits);
      }
    }
  });
}

}  // namespace

void write_low_precision_(const at::Tensor& param, const at::Tensor& target,
                          LowPrecisionUpdate rule, at::Tensor& comp, const RoundingKey& key,
                          const char* optimizer) {
  TORCH_INTERNAL_ASSERT(amp::is_low_precision(param.scalar_type()));
  TORCH_INTERNAL_ASSERT(target.scalar_type() == at::kFloat && target.sizes() == param.sizes());
  if (rule == LowPrecisionUpdate::kNearest) {
    param.copy_(target);
    return;
  }
  if (rule == LowPrecisionUpdate::kKahan && !comp.defined()) {
    comp = at::zeros_like(param, at::MemoryFormat::Contiguous);
  }
#ifdef MANTISSA_WITH_CUDA
  if (param.is_cuda()) {
    TORCH_INTERNAL_ASSERT(target.device() == param.device() &&
                          (!comp.defined() || comp.device() == param.device()));
    auto out = param.is_contiguous() ? param : param.contiguous();
    const auto in = target.contiguous();
    auto c = rule == LowPrecisionUpdate::kKahan ? comp.contiguous() : at::Tensor();
    cuda::write_low_precision(out, in, rule == LowPrecisionUpdate::kKahan, c, key);
    if (!out.is_same(param)) param.copy_(out);
    if (c.defined() && !c.is_same(comp)) comp.copy_(c);
    return;
  }
#endif
  if (!param.is_cpu()) {
    // A device without a kernel here: the same elements written on the host (same bits), at
    // the cost of a round trip.
    TORCH_WARN_ONCE(optimizer, ": low_precision_update ", to_string(rule), " writes a ",
                    param.device().type(),
                    " parameter through host memory (a copy each way per step); train with "
                    "fp32 master weights to avoid it");
    auto p_host = param.cpu();
    auto c_host = comp.defined() ? comp.cpu() : at::Tensor();
    write_low_precision_(p_host, target.cpu(), rule, c_host, key, optimizer);
    param.copy_(p_host);
    if (c_host.defined()) comp.copy_(c_host);
    return;
  }
  TORCH_INTERNAL_ASSERT(
      rule != LowPrecisionUpdate::kKahan ||
      (comp.scalar_type() == param.scalar_type() && comp.sizes() == param.sizes()));
  // Written in place when contiguous, else through a contiguous copy.
  auto out = param.is_contiguous() ? param : param.contiguous();
  const auto in = target.contiguous();
  auto c = rule == LowPrecisionUpdate::kKahan ? comp.contiguous() : at::Tensor();
  auto* p = static_cast<std::uint16_t*>(out.data_ptr());
  const auto* t = in.data_ptr<float>();
  auto* cp = c.defined() ? static_cast<std::uint16_t*>(c.data_ptr()) : nullptr;
  if (param.scalar_type() == at::kBFloat16) {
    write_elements<true>(p, t, cp, rule, key, param.numel());
  } else {
    write_elements<false>(p, t, cp, rule, key, param.numel());
  }
  if (!out.is_same(param)) param.copy_(out);
  if (c.defined() && !c.is_same(comp)) comp.copy_(c);
}

}  // namespace mantissa::optim::detail
