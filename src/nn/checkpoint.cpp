#include <mantissa/nn/checkpoint.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace mantissa::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The autocast settings of the two device types a block can run on, and the cast cache's flag.
struct AutocastSettings {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::kHalf;
  bool cache_enabled = true;

  static AutocastSettings current() {
    AutocastSettings s;
    s.cpu_enabled = at::autocast::is_autocast_enabled(c10::kCPU);
    s.cpu_dtype = at::autocast::get_autocast_dtype(c10::kCPU);
    s.cuda_enabled = at::autocast::is_autocast_enabled(c10::kCUDA);
    s.cuda_dtype = at::autocast::get_autocast_dtype(c10::kCUDA);
    s.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return s;
  }
  // These settings with the cast cache off: how `fn` runs, both times.
  AutocastSettings for_fn() const {
    AutocastSettings out = *this;
    out.cache_enabled = false;
    return out;
  }
  void apply() const {
    at::autocast::set_autocast_enabled(c10::kCPU, cpu_enabled);
    at::autocast::set_autocast_dtype(c10::kCPU, cpu_dtype);
    at::autocast::set_autocast_enabled(c10::kCUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(c10::kCUDA, cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache_enabled);
  }
};

// The states of the CPU generator and of the CUDA generators of some devices.
struct RngStates {
  std::vector<std::pair<at::Generator, at::Tensor>> states;

  static RngStates capture(const std::vector<c10::Device>& cuda_devices) {
    RngStates out;
    out.add(at::detail::getDefaultCPUGenerator());
    for (const auto& device : cuda_devices) out.add(at::globalContext().defaultGenerator(device));
    return out;
  }
  void apply() const {
    for (const auto& [generator, state] : states) {
      at::Generator gen = generator;  // a handle on the same generator, not const
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }

 private:
  void add(at::Generator generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    states.emplace_back(generator, generator.get_state());
  }
};

// Puts back, at the end of its scope, the settings or states read when it was made (also when
// `fn` throws): an AutocastSettings or RngStates.
template <class Saved>
class RestoreAtExit {
 public:
  explicit RestoreAtExit(Saved saved) : saved_(std::move(saved)) {}
  ~RestoreAtExit() { saved_.apply(); }
  RestoreAtExit(const RestoreAtExit&) = delete;
  RestoreAtExit& operator=(const RestoreAtExit&) = delete;

 private:
  Saved saved_;
};

// What the backward needs besides the inputs: the function, and the settings of the first run.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointedFunction fn;
  std::size_t num_inputs = 0;
  std::size_t num_tensors = 0;  // the inputs and the placeholder, when there is one
  bool preserve_rng_state = true;
  AutocastSettings autocast;
  std::vector<c10::Device> cuda_devices;
  RngStates rng;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // `tensors` is the inputs, then, when none of them requires grad, one empty tensor that
  // does, so that the backward runs for the parameters inside fn.
  static variable_list forward(AutogradContext* ctx, at::TensorList tensors,
                               c10::intrusive_ptr<CheckpointState> state) {
    state->autocast = AutocastSettings::current();
    if (state->preserve_rng_state) state->rng = RngStates::capture(state->cuda_devices);
    const std::vector<at::Tensor> inputs(tensors.begin(), tensors.begin() + state->num_inputs);
    variable_list outputs;
    {
      RestoreAtExit<AutocastSettings> restore_autocast(AutocastSettings::current());
      state->autocast.for_fn().apply();
      outputs = state->fn(inputs);
    }
    for (const auto& output : outputs) {
      TORCH_CHECK_VALUE(!output.defined() || output.is_floating_point() || output.is_complex(),
                        "checkpoint: the function returned a tensor of dtype ",
                        output.scalar_type(), "; every output must be floating point");
    }
    ctx->save_for_backward(inputs);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    ctx->set_materialize_grads(false);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto state =
        c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      auto input = saved[i].detach();
      input.requires_grad_(ctx->needs_input_grad(i));
      inputs.push_back(std::move(input));
    }
    variable_list outputs;
    {
      // Fork the generators: the forward's states for the recompute, the caller's after it.
      std::optional<RestoreAtExit<RngStates>> restore_rng;
      if (state->preserve_rng_state) {
        restore_rng.emplace(RngStates::capture(state->cuda_devices));
        state->rng.apply();
      }
      RestoreAtExit<AutocastSettings> restore_autocast(AutocastSettings::current());
      state->autocast.for_fn().apply();
      at::AutoGradMode grad_mode(true);
      outputs = state->fn(inputs);
    }
    TORCH_CHECK(outputs.size() == grad_outputs.size(), "checkpoint: the recompute returned ",
                outputs.size(), " tensors, the first run ", grad_outputs.size(),
                "; the function must compute the same thing both times");
    variable_list roots, root_grads;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);

    variable_list grads(state->num_inputs);
    for (std::size_t i = 0; i < state->num_inputs; ++i) {
      if (inputs[i].requires_grad()) grads[i] = inputs[i].grad();
    }
    // The placeholder tensor, when there is one, and the state argument get no gradient.
    grads.resize(state->num_tensors + 1);
    return grads;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(const CheckpointedFunction& fn,
                                   const std::vector<at::Tensor>& inputs, bool preserve_rng_state) {
  TORCH_CHECK_VALUE(static_cast<bool>(fn), "checkpoint: the function is empty");
  if (!at::GradMode::is_enabled()) return fn(inputs);
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->num_inputs = inputs.size();
  state->preserve_rng_state = preserve_rng_state;
  bool any_requires_grad = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& input = inputs[i];
    // A custom Function takes no undefined tensor among its inputs.
    TORCH_CHECK_VALUE(input.defined(), "checkpoint: input ", i, " is an undefined tensor");
    any_requires_grad = any_requires_grad || input.requires_grad();
    const auto device = input.device();
    if (device.is_cuda() && std::find(state->cuda_devices.begin(), state->cuda_devices.end(),
                                      device) == state->cuda_devices.end()) {
      state->cuda_devices.push_back(device);
    }
  }
  std::vector<at::Tensor> tensors = inputs;
  if (!any_requires_grad) {
    tensors.push_back(at::empty({0}, at::TensorOptions().dtype(at::kFloat)).requires_grad_(true));
  }
  state->num_tensors = tensors.size();
  return CheckpointFunction::apply(at::TensorList(tensors), std::move(state));
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn,
                      const at::Tensor& input, bool preserve_rng_state) {
  TORCH_CHECK_VALUE(static_cast<bool>(fn), "checkpoint: the function is empty");
  return checkpoint(
      // By value: the backward calls it again after this function has returned.
      [fn](const std::vector<at::Tensor>& inputs) {
        return std::vector<at::Tensor>{fn(inputs[0])};
      },
      {input}, preserve_rng_state)[0];
}

}  // namespace mantissa::nn
