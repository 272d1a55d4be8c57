#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

namespace mantissa::amp {

/// fp32 master copies of a model's low-precision (bf16/fp16) parameters.
///
/// A model stored in bf16 or fp16 trains badly when the optimizer updates the bf16 weights
/// themselves: an update smaller than half a unit in the last place of a weight (about 2^-9 of
/// its magnitude in bf16) rounds away. `MasterWeights` keeps an fp32 copy of each such
/// parameter; the optimizer updates the copies, and the model gets them back, cast, after each
/// step. fp32 parameters are their own master: no copy, no extra memory.
///
///     auto model = Net(); model->to(torch::kBFloat16);
///     mantissa::amp::MasterWeights masters(model->parameters());
///     torch::optim::AdamW optimizer(masters.master_params(), 1e-3);
///     ...
///     loss.backward();                      // bf16 grads on the model
///     masters.copy_grads_to_masters();      // -> fp32 grads on the masters
///     scaler.unscale_(optimizer);           // fp32: no "Attempting to unscale FP16 gradients."
///     torch::nn::utils::clip_grad_norm_(masters.master_params(), 1.0);
///     scaler.step(optimizer);               // updates the fp32 masters (or skips)
///     masters.copy_masters_to_model();      // fp32 -> bf16 model (a no-op in value after a skip)
///     scaler.update();
///     masters.zero_grad();
///
/// Python: what apex's `amp_C` O2 level and DeepSpeed's bf16 optimizer do, and what the PyTorch
/// mixed-precision guide asks of the user by hand ("load the model in fp32"). With
/// `mantissa::optim::FusedAdamW(masters)` the cast back happens inside the optimizer's update.
///
/// Nothing here syncs with the device. Move-only: the masters are the training state.
class MasterWeights {
 public:
  /// `model_params`: the model's parameters in optimizer order. Each bf16/fp16 one gets an fp32
  /// master (a new leaf tensor with the same shape, strides and device, `requires_grad` as the
  /// parameter) and, when it requires grad, an fp32 gradient buffer allocated now, so that the
  /// memory is taken (and reported by `bytes_per_parameter()`) before training starts. Other
  /// floating parameters (fp32, fp64) are their own master: no copy. The same tensor listed
  /// twice (tied weights) gets one master. Throws `c10::ValueError` naming the index of an
  /// undefined or non-floating tensor.
  explicit MasterWeights(std::vector<at::Tensor> model_params);

  /// `MasterWeights(module.parameters())`.
  explicit MasterWeights(const torch::nn::Module& module);

  MasterWeights(MasterWeights&&) noexcept;
  MasterWeights& operator=(MasterWeights&&) noexcept;
  MasterWeights(const MasterWeights&) = delete;
  MasterWeights& operator=(const MasterWeights&) = delete;
  ~MasterWeights();

  /// The model's parameters, as given.
  const std::vector<at::Tensor>& model_params() const noexcept { return model_params_; }

  /// The tensors an optimizer should update: the fp32 master of each model parameter, or the
  /// parameter itself where it is its own master. Same order and length as `model_params()`.
  const std::vector<at::Tensor>& master_params() const noexcept { return master_params_; }

  /// The masters of `model_params` (for example one parameter group of the model), in that
  /// order. Throws `c10::ValueError` naming the index of a tensor that is not one of this
  /// object's model parameters.
  std::vector<at::Tensor> masters_for(const std::vector<at::Tensor>& model_params) const;

  /// The master of one model parameter (the parameter itself if it is its own master). Throws
  /// `c10::ValueError` if `model_param` is not one of this object's model parameters.
  const at::Tensor& master_of(const at::Tensor& model_param) const;

  /// True when at least one parameter is bf16 or fp16 and so has a separate fp32 master.
  bool has_low_precision() const noexcept { return num_low_precision_ > 0; }

  /// Copies each low-precision parameter's gradient (any dtype) into its master's fp32
  /// gradient buffer, and makes that buffer the master's `.grad()`. A parameter without a
  /// gradient leaves its master's gradient undefined. Call after backward (after the last
  /// micro-batch when accumulating). Python: `master.grad = param.grad.float()` per pair,
  /// without a new allocation. No sync.
  void copy_grads_to_masters();

  /// Casts each fp32 master into its low-precision model parameter (round to nearest even).
  /// Call after an optimizer step. After a skipped step the masters are unchanged, so the
  /// model is too. Python: `param.copy_(master)` per pair. No sync.
  void copy_masters_to_model();

  /// Copies the model's parameters into the masters: the way back after the model's weights
  /// were set directly (loaded from a file, re-initialised). No sync.
  void copy_model_to_masters();

  /// Clears the gradients of the model parameters and of the masters. `set_to_none` (the
  /// default, as `torch::optim::Optimizer::zero_grad`) drops the `.grad()` references; the
  /// masters' fp32 buffers stay allocated for the next `copy_grads_to_masters()`.
  /// Python: `model.zero_grad(); optimizer.zero_grad()`. No sync.
  void zero_grad(bool set_to_none = true);

  /// Bytes this object holds (masters and their fp32 gradient buffers) per model parameter
  /// element, rounded to the nearest integer: 8 for a bf16 model whose parameters all require
  /// grad (4 master + 4 master grad), 0 for an fp32 model. Measured from the tensors' storage,
  /// not assumed from dtypes. No sync.
  std::int64_t bytes_per_parameter() const;

  /// Bytes of the tensors this object holds (masters and master gradient buffers). No sync.
  std::int64_t bytes() const;

  /// Number of elements of the model parameters (each distinct tensor counted once).
  std::int64_t numel() const noexcept { return numel_; }

  /// Writes the fp32 masters (the truth; the bf16 model parameters are derived from them)
  /// under `masters/size` and `masters/<i>`, one per model parameter. Python:
  /// `torch.save([m for m in masters], ...)`, as DeepSpeed's `fp32_partitioned_groups_flat`.
  /// Syncs (the tensors are copied out).
  void save(torch::serialize::OutputArchive& archive) const;

  /// Reads what `save` wrote into the masters (in place, so an optimizer built on
  /// `master_params()` keeps its state) and casts them into the model parameters. Throws
  /// `c10::ValueError` naming the index, before anything is copied, when the count or a shape
  /// does not match, or a master is not floating-point or holds NaN or inf (with the first such
  /// value). Syncs (reads the count of non-finite values).
  void load(torch::serialize::InputArchive& archive);

  /// `save` for the masters of `model_params` alone, in that order: what a MasterWeights built
  /// over exactly those parameters writes. For a process that owns part of a model (the
  /// sharding by whole tensors) and writes its share as a whole model's file would hold it.
  /// Throws `c10::ValueError` for a tensor that is not one of the parameters this object was
  /// built from. Syncs (the tensors are copied out).
  void save(torch::serialize::OutputArchive& archive,
            const std::vector<at::Tensor>& model_params) const;

  /// `load` for the masters of `model_params` alone: `masters/<positions[i]>` of an archive that
  /// `save` wrote for `archive_size` parameters becomes `model_params[i]`'s master, and those
  /// parameters get its value. Checked as `load` checks (the count, each shape, floating-point,
  /// finite) before anything is copied; the other masters are neither read nor touched. Python:
  /// loading one rank's share of a whole model's masters. Syncs.
  void load(torch::serialize::InputArchive& archive, const std::vector<at::Tensor>& model_params,
            const std::vector<std::size_t>& positions, std::size_t archive_size);

 private:
  std::vector<at::Tensor> model_params_;
  std::vector<at::Tensor> master_params_;
  // Per model parameter: whether it has a separate master, and that master's grad buffer.
  std::vector<bool> has_master_;
  std::vector<at::Tensor> grad_buffers_;
  std::unordered_map<const c10::TensorImpl*, std::size_t> index_of_;
  std::int64_t num_low_precision_ = 0;
  std::int64_t numel_ = 0;
};

/// True for the dtypes that get an fp32 master: bfloat16 and float16.
inline bool is_low_precision(c10::ScalarType dtype) noexcept {
  return dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half;
}

/// Emits, once per process and dtype, the warning that training `dtype` parameters without fp32
/// master weights loses small updates ("pure bf16"): an update smaller than half a unit in the
/// last place of a weight rounds away, so small learning rates can leave weights unchanged.
/// Returns true when it warned now. The memory-lean mode stays available; this only says what
/// it costs. Python: no equivalent (PyTorch stays silent). No sync.
bool warn_pure_low_precision_once(c10::ScalarType dtype = c10::ScalarType::BFloat16);

}  // namespace mantissa::amp
