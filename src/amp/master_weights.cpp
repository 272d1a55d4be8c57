#include <mantissa/amp/master_weights.h>

#include <atomic>
#include <cmath>
#include <string>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/serialize/archive.h>

#include "value_checks.h"

namespace mantissa::amp {
namespace {

std::int64_t storage_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.storage().nbytes()) : 0;
}

}  // namespace

MasterWeights::MasterWeights(std::vector<at::Tensor> model_params)
    : model_params_(std::move(model_params)) {
  at::NoGradGuard no_grad;
  const auto n = model_params_.size();
  master_params_.reserve(n);
  has_master_.reserve(n);
  grad_buffers_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& param = model_params_[i];
    TORCH_CHECK_VALUE(param.defined(), "MasterWeights: model parameter ", i, " is undefined");
    TORCH_CHECK_VALUE(at::isFloatingType(param.scalar_type()), "MasterWeights: model parameter ", i,
                      " has dtype ", param.scalar_type(),
                      "; only floating-point parameters can be trained");
    if (auto seen = index_of_.find(param.unsafeGetTensorImpl()); seen != index_of_.end()) {
      // The same tensor again (tied weights): share its master and its gradient buffer.
      master_params_.push_back(master_params_[seen->second]);
      has_master_.push_back(has_master_[seen->second]);
      grad_buffers_[i] = grad_buffers_[seen->second];
      continue;
    }
    index_of_.emplace(param.unsafeGetTensorImpl(), i);
    numel_ += param.numel();
    if (!is_low_precision(param.scalar_type())) {
      master_params_.push_back(param);
      has_master_.push_back(false);
      continue;
    }
    // Same strides as the parameter (MemoryFormat::Preserve), so gradients, moments and the
    // cast back all walk memory in the same order.
    auto master = param.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    master.set_requires_grad(param.requires_grad());
    if (param.requires_grad()) grad_buffers_[i] = at::empty_like(master);
    master_params_.push_back(std::move(master));
    has_master_.push_back(true);
    ++num_low_precision_;
  }
}

MasterWeights::MasterWeights(const torch::nn::Module& module)
    : MasterWeights(module.parameters()) {}

MasterWeights::MasterWeights(MasterWeights&&) noexcept = default;
MasterWeights& MasterWeights::operator=(MasterWeights&&) noexcept = default;
MasterWeights::~MasterWeights() = default;

const at::Tensor& MasterWeights::master_of(const at::Tensor& model_param) const {
  const auto it =
      model_param.defined() ? index_of_.find(model_param.unsafeGetTensorImpl()) : index_of_.end();
  TORCH_CHECK_VALUE(
      it != index_of_.end(),
      "MasterWeights: the tensor is not one of the model parameters it was built from");
  return master_params_[it->second];
}

std::vector<at::Tensor> MasterWeights::masters_for(
    const std::vector<at::Tensor>& model_params) const {
  std::vector<at::Tensor> masters;
  masters.reserve(model_params.size());
  for (std::size_t i = 0; i < model_params.size(); ++i) {
    const auto& param = model_params[i];
    const auto it = param.defined() ? index_of_.find(param.unsafeGetTensorImpl()) : index_of_.end();
    TORCH_CHECK_VALUE(it != index_of_.end(), "MasterWeights::masters_for: tensor ", i,
                      " is not one of the model parameters this MasterWeights was built from");
    masters.push_back(master_params_[it->second]);
  }
  return masters;
}

void MasterWeights::copy_grads_to_masters() {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < model_params_.size(); ++i) {
    if (!has_master_[i]) continue;
    const auto& grad = model_params_[i].grad();
    auto& master = master_params_[i];
    if (!grad.defined()) {
      master.mutable_grad().reset();
      continue;
    }
    TORCH_CHECK_VALUE(!grad.is_sparse(), "MasterWeights: model parameter ", i,
                      " has a sparse gradient; master weights support dense gradients only");
    auto& buffer = grad_buffers_[i];
    if (!buffer.defined()) buffer = at::empty_like(master);  // requires_grad was switched on later
    buffer.copy_(grad);
    master.mutable_grad() = buffer;
  }
}

void MasterWeights::copy_masters_to_model() {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < model_params_.size(); ++i) {
    if (has_master_[i]) model_params_[i].copy_(master_params_[i]);
  }
}

void MasterWeights::copy_model_to_masters() {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < model_params_.size(); ++i) {
    if (has_master_[i]) master_params_[i].copy_(model_params_[i]);
  }
}

void MasterWeights::zero_grad(bool set_to_none) {
  auto clear = [set_to_none](at::Tensor& t) {
    auto& grad = t.mutable_grad();
    if (!grad.defined()) return;
    if (set_to_none) {
      grad.reset();
    } else {
      if (grad.grad_fn()) {
        grad = grad.detach();
      } else {
        grad.requires_grad_(false);
      }
      grad.zero_();
    }
  };
  for (std::size_t i = 0; i < model_params_.size(); ++i) {
    clear(model_params_[i]);
    if (has_master_[i]) clear(master_params_[i]);
  }
}

std::int64_t MasterWeights::bytes() const {
  std::unordered_set<const c10::StorageImpl*> counted;
  std::int64_t total = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && counted.insert(t.storage().unsafeGetStorageImpl()).second) {
      total += storage_bytes(t);
    }
  };
  for (std::size_t i = 0; i < model_params_.size(); ++i) {
    if (!has_master_[i]) continue;
    add(master_params_[i]);
    add(grad_buffers_[i]);
  }
  return total;
}

std::int64_t MasterWeights::bytes_per_parameter() const {
  if (numel_ == 0) return 0;
  return static_cast<std::int64_t>(
      std::llround(static_cast<double>(bytes()) / static_cast<double>(numel_)));
}

void MasterWeights::save(torch::serialize::OutputArchive& archive) const {
  save(archive, model_params_);
}

void MasterWeights::save(torch::serialize::OutputArchive& archive,
                         const std::vector<at::Tensor>& model_params) const {
  const auto masters = masters_for(model_params);
  archive.write("masters/size", at::tensor(static_cast<std::int64_t>(masters.size())));
  for (std::size_t i = 0; i < masters.size(); ++i) {
    archive.write("masters/" + std::to_string(i), masters[i].detach(), /*is_buffer=*/true);
  }
}

void MasterWeights::load(torch::serialize::InputArchive& archive) {
  std::vector<std::size_t> positions(model_params_.size());
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = i;
  load(archive, model_params_, positions, model_params_.size());
}

void MasterWeights::load(torch::serialize::InputArchive& archive,
                         const std::vector<at::Tensor>& model_params,
                         const std::vector<std::size_t>& positions, std::size_t archive_size) {
  TORCH_CHECK_VALUE(positions.size() == model_params.size(),
                    "MasterWeights::load: ", positions.size(), " positions for ",
                    model_params.size(), " parameters");
  const auto masters = masters_for(model_params);
  at::Tensor size;
  archive.read("masters/size", size);
  const auto count = size.numel() == 1 ? size.item<std::int64_t>() : -1;
  TORCH_CHECK_VALUE(count == static_cast<std::int64_t>(archive_size),
                    "MasterWeights::load: the archive holds ", count, " masters, this model has ",
                    archive_size, " parameters");
  std::vector<at::Tensor> saved(masters.size());
  for (std::size_t i = 0; i < masters.size(); ++i) {
    const auto k = positions[i];
    TORCH_CHECK_VALUE(k < archive_size, "MasterWeights::load: position ", k, " of parameter ", i,
                      " is past the archive's ", archive_size, " masters");
    archive.read("masters/" + std::to_string(k), saved[i], /*is_buffer=*/true);
    TORCH_CHECK_VALUE(saved[i].sizes() == masters[i].sizes(), "MasterWeights::load: master ", k,
                      " has shape ", saved[i].sizes(), " in the archive but ", masters[i].sizes(),
                      " in the model");
    TORCH_CHECK_VALUE(at::isFloatingType(saved[i].scalar_type()), "MasterWeights::load: master ", k,
                      " is ", saved[i].scalar_type(), ", not a floating-point tensor");
    // Checked before anything is copied: NaN weights would make every later loss NaN.
    if (const auto bad = mantissa::detail::find_nonfinite(saved[i])) {
      TORCH_CHECK_VALUE(false, "MasterWeights::load: master ", k,
                        " holds NaN or infinite values: ", bad->text());
    }
  }
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < masters.size(); ++i) {
    auto master = masters[i];
    master.copy_(saved[i]);
    if (!master.is_same(model_params[i])) model_params[i].copy_(master);
  }
}

bool warn_pure_low_precision_once(c10::ScalarType dtype) {
  static std::atomic<bool> warned_bf16{false};
  static std::atomic<bool> warned_fp16{false};
  if (!is_low_precision(dtype)) return false;
  auto& warned = dtype == c10::ScalarType::BFloat16 ? warned_bf16 : warned_fp16;
  if (warned.exchange(true)) return false;
  const char* bits = dtype == c10::ScalarType::BFloat16 ? "8" : "11";
  TORCH_WARN("Training ", dtype, " parameters without fp32 master weights: ", dtype, " keeps ",
             bits,
             " significant bits, so an update smaller than half a unit in the "
             "last place of a weight rounds away and small learning rates can leave weights "
             "unchanged. Keep fp32 master weights (mantissa::amp::MasterWeights) unless memory "
             "forbids it.");
  return true;
}

}  // namespace mantissa::amp
