#include <mantissa/nn/linear_cross_entropy.h>

#include <algorithm>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include "checked_math.h"

namespace mantissa::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dtypes of one call: the logits' matmul, and the gradient matmuls.
struct Dtypes {
  c10::ScalarType compute;
  c10::ScalarType gradient;
};

Dtypes dtypes_of(const at::Tensor& hidden) {
  const auto device_type = hidden.device().type();
  const auto compute = at::autocast::is_autocast_enabled(device_type) && hidden.is_floating_point()
                           ? at::autocast::get_autocast_dtype(device_type)
                           : hidden.scalar_type();
  // fp16 gradients are computed before the loss scale multiplies them: float32 keeps them.
  return {compute, compute == c10::kHalf ? c10::kFloat : compute};
}

// Liger's chunk (about as many logits as `hidden` has elements), but at least the rows whose
// float32 logits fill 128 MiB: every chunk adds a rank-`rows` product into the whole of
// grad_weight, and with Liger's few rows at a GPT-2-sized vocabulary those passes over
// grad_weight make a CPU step slower than the unfused pair (BENCHMARKS.md, "Pointers from the
// code").
// A power of two either way.
int64_t auto_chunk_size(int64_t rows, int64_t vocab, int64_t in_features) {
  const int64_t factor = std::max<int64_t>(1, mantissa::detail::ceil_div(vocab, in_features));
  const int64_t liger = std::max<int64_t>(1, mantissa::detail::ceil_div(rows, factor));
  int64_t size = 1;
  while (size < liger) size *= 2;
  constexpr int64_t kLogitsBytes = int64_t{128} << 20;
  const int64_t budget_rows = kLogitsBytes / (vocab * static_cast<int64_t>(sizeof(float)));
  while (size * 2 <= budget_rows) size *= 2;
  return std::min(size, std::max<int64_t>(rows, 1));
}

// The loss of every chunk and, when `with_grads`, the gradients at unit loss gradient.
struct Pass {
  at::Tensor loss;         // 0-d float32
  at::Tensor grad_hidden;  // [N, in] float32
  at::Tensor grad_weight;  // [vocab, in] float32
  at::Tensor grad_bias;    // [vocab] float32, or undefined
};

Pass run_chunks(const at::Tensor& hidden2d, const at::Tensor& weight, const at::Tensor& bias,
                const at::Tensor& targets1d, int64_t ignore_index, int64_t chunk_size,
                bool with_grads) {
  // Read before the guard: with autocast's keys excluded, autocast reads as off.
  const auto dtypes = dtypes_of(hidden2d);
  // The casts and matmuls below are chosen here, not by autocast.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t rows = hidden2d.size(0);
  const int64_t vocab = weight.size(0);
  const auto weight_c = weight.to(dtypes.compute);
  const auto bias_c = bias.defined() ? bias.to(dtypes.compute) : at::Tensor();
  const auto weight_g = with_grads ? weight.to(dtypes.gradient) : at::Tensor();

  const auto f32 = hidden2d.options().dtype(at::kFloat);
  const auto valid_all = targets1d != ignore_index;
  const auto count = valid_all.sum().to(at::kFloat);
  // Ignored rows get no gradient; with every row ignored all gradients are zero (PyTorch's).
  const auto grad_scale = count.clamp_min(1.0).reciprocal();

  Pass out;
  out.loss = at::zeros({}, f32);
  if (with_grads) {
    out.grad_hidden = at::empty({rows, hidden2d.size(1)}, f32);
    out.grad_weight = at::zeros(weight.sizes(), f32);
    if (bias.defined()) out.grad_bias = at::zeros({vocab}, f32);
  }
  if (chunk_size <= 0) chunk_size = auto_chunk_size(rows, vocab, hidden2d.size(1));
  for (int64_t start = 0; start < rows; start += chunk_size) {
    const int64_t length = std::min(chunk_size, rows - start);
    const auto h = hidden2d.narrow(0, start, length);
    const auto t = targets1d.narrow(0, start, length);
    const auto valid = valid_all.narrow(0, start, length);
    const auto safe_t = at::where(valid, t, at::zeros({}, t.options())).unsqueeze(1);

    const auto h_c = h.to(dtypes.compute);
    auto logits = at::linear(h_c, weight_c, bias_c).to(at::kFloat);
    const auto lse = at::logsumexp(logits, {1});
    const auto target_logit = logits.gather(1, safe_t).squeeze(1);
    out.loss.add_(at::where(valid, lse - target_logit, at::zeros({}, f32)).sum());
    if (!with_grads) continue;

    // d loss / d logits = (softmax - one_hot(target)) / count, zero on ignored rows; made in
    // place in the logits' buffer.
    auto& grad_logits = logits;
    grad_logits.sub_(lse.unsqueeze(1)).exp_();
    const auto valid_f = valid.to(at::kFloat).unsqueeze(1);
    grad_logits.scatter_add_(1, safe_t, -valid_f);
    grad_logits.mul_(valid_f * grad_scale);
    const auto g = grad_logits.to(dtypes.gradient);
    out.grad_hidden.narrow(0, start, length).copy_(at::mm(g, weight_g));
    out.grad_weight.add_(at::mm(g.t(), h_c.to(dtypes.gradient)));
    if (bias.defined()) out.grad_bias.add_(g.sum(0));
  }
  out.loss.div_(count);
  return out;
}

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  // `bias` is optional: an undefined tensor cannot be an input of a custom Function.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden2d,
                            const at::Tensor& weight,
                            const std::optional<at::Tensor>& optional_bias,
                            const at::Tensor& targets1d, int64_t ignore_index, int64_t chunk_size) {
    const at::Tensor bias = optional_bias.value_or(at::Tensor());
    auto pass = run_chunks(hidden2d, weight, bias, targets1d, ignore_index, chunk_size,
                           /*with_grads=*/true);
    ctx->save_for_backward({pass.grad_hidden, pass.grad_weight, pass.grad_bias});
    ctx->saved_data["hidden_dtype"] = hidden2d.scalar_type();
    ctx->saved_data["weight_dtype"] = weight.scalar_type();
    ctx->saved_data["bias_dtype"] = bias.defined() ? bias.scalar_type() : weight.scalar_type();
    return pass.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& grad_loss = grad_outputs[0];
    auto scaled = [&](const at::Tensor& grad, const char* dtype_key) {
      if (!grad.defined()) return at::Tensor();
      return (grad * grad_loss).to(ctx->saved_data[dtype_key].toScalarType());
    };
    return {ctx->needs_input_grad(0) ? scaled(saved[0], "hidden_dtype") : at::Tensor(),
            ctx->needs_input_grad(1) ? scaled(saved[1], "weight_dtype") : at::Tensor(),
            ctx->needs_input_grad(2) ? scaled(saved[2], "bias_dtype") : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& bias, const at::Tensor& targets,
                                int64_t ignore_index, int64_t chunk_size) {
  TORCH_CHECK_VALUE(hidden.defined(), "linear_cross_entropy: hidden is an undefined tensor");
  TORCH_CHECK_VALUE(hidden.dim() >= 1 && hidden.is_floating_point(),
                    "linear_cross_entropy: hidden must be a floating-point tensor [..., in], got ",
                    hidden.scalar_type(), " of shape ", hidden.sizes());
  TORCH_CHECK_VALUE(weight.defined() && weight.dim() == 2 && weight.size(1) == hidden.size(-1),
                    "linear_cross_entropy: weight must be [vocab, in] with in = ", hidden.size(-1),
                    " (hidden's last size), got ",
                    weight.defined() ? weight.sizes() : at::IntArrayRef{});
  TORCH_CHECK_VALUE(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
                    "linear_cross_entropy: bias must be [vocab] = [", weight.size(0), "], got ",
                    bias.sizes());
  TORCH_CHECK_VALUE(targets.defined(), "linear_cross_entropy: targets is an undefined tensor");
  TORCH_CHECK_VALUE(
      !targets.is_floating_point() && !targets.is_complex() && targets.scalar_type() != at::kBool,
      "linear_cross_entropy: targets must hold integer class indices, got a ",
      targets.scalar_type(), " tensor");
  const auto in_features = hidden.size(-1);
  const auto hidden2d = hidden.reshape({-1, in_features});
  const auto targets1d = targets.reshape({-1}).to(at::kLong);
  TORCH_CHECK_VALUE(targets1d.size(0) == hidden2d.size(0),
                    "linear_cross_entropy: ", targets1d.size(0), " targets for ", hidden2d.size(0),
                    " rows of hidden");
  TORCH_CHECK_VALUE(chunk_size >= 0,
                    "linear_cross_entropy: chunk_size must be >= 0 (0 picks "
                    "one), got ",
                    chunk_size);
  const bool needs_grad =
      at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad() ||
                                     (bias.defined() && bias.requires_grad()));
  if (!needs_grad) {
    return run_chunks(hidden2d, weight, bias, targets1d, ignore_index, chunk_size,
                      /*with_grads=*/false)
        .loss;
  }
  return LinearCrossEntropyFunction::apply(
      hidden2d, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, targets1d,
      ignore_index, chunk_size);
}

}  // namespace mantissa::nn
