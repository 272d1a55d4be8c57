// The values the Trainer derives from TrainingArguments, and equality.
#include <cmath>

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <mantissa/distributed.h>
#include <mantissa/distributed_backend.h>
#include <mantissa/training_arguments.h>

#include "checked_math.h"
#include "training_arguments/fsdp_checks.h"
#include "training_arguments/python_repr.h"

namespace mantissa {

c10::ScalarType TrainingArguments::compute_dtype() const {
  TORCH_CHECK_VALUE(!(fp16_ && bf16_), "At most one of fp16 and bf16 can be True, but not both");
  if (bf16_) return c10::kBFloat16;
  if (fp16_) return c10::kHalf;
  return c10::kFloat;
}

c10::Device TrainingArguments::device() const {
  if (use_cpu_ || !torch::cuda::is_available()) return c10::Device(c10::kCPU);
  const auto local_rank = distributed::DistributedEnvironment::from_env().local_rank;
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  TORCH_CHECK_VALUE(local_rank < count, "LOCAL_RANK=", local_rank, " asks for cuda:", local_rank,
                    " but this machine has ", count,
                    " CUDA device(s); start at most that many processes per node "
                    "(torchrun --nproc_per_node)");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

distributed::Backend TrainingArguments::resolved_ddp_backend(const c10::Device& device) const {
  if (ddp_backend_) return Choice<distributed::Backend>(*ddp_backend_).value();
  return device.is_cuda() ? distributed::Backend::kNccl : distributed::Backend::kGloo;
}

bool TrainingArguments::resolved_ddp_find_unused_parameters() const {
  return ddp_find_unused_parameters_.value_or(true);
}

int64_t TrainingArguments::resolved_ddp_bucket_cap_mb() const {
  return ddp_bucket_cap_mb_.value_or(25);
}

bool TrainingArguments::resolved_ddp_broadcast_buffers() const {
  return ddp_broadcast_buffers_.value_or(true);
}

bool TrainingArguments::fsdp_shards_grad_op() const {
  return detail::read_fsdp_settings(fsdp_, fsdp_config_).shards_grad_op();
}

bool TrainingArguments::fsdp_shards_parameters() const {
  return detail::read_fsdp_settings(fsdp_, fsdp_config_).shards_parameters();
}

fp8::Float8Recipe TrainingArguments::float8_recipe() const {
  return fp8::Float8Recipe()
      .recipe(fp8_recipe_.value())
      .fp8_format(fp8_format_.value())
      .amax_history_len(fp8_amax_history_len_)
      .amax_compute_algo(fp8_amax_compute_algo_.value())
      .margin(fp8_margin_);
}

double TrainingArguments::init_loss_scale() const {
  if (loss_scale_ > 0) return loss_scale_;
  return std::ldexp(1.0, static_cast<int>(initial_scale_power_));
}

double TrainingArguments::resolved_eval_steps() const {
  return eval_steps_ && *eval_steps_ != 0 ? *eval_steps_ : logging_steps_;
}

std::string TrainingArguments::resolved_metric_for_best_model() const {
  const std::string metric = metric_for_best_model_.value_or("loss");
  return metric.rfind("eval_", 0) == 0 ? metric : "eval_" + metric;
}

bool TrainingArguments::resolved_greater_is_better() const {
  if (greater_is_better_) return *greater_is_better_;
  const std::string metric = metric_for_best_model_.value_or("loss");
  const std::string suffix = "loss";
  return !(metric.size() >= suffix.size() &&
           metric.compare(metric.size() - suffix.size(), suffix.size(), suffix) == 0);
}

int64_t TrainingArguments::resolve_steps(double steps, int64_t max_steps) {
  // validate() keeps the intervals in range; this keeps a direct call defined.
  TORCH_CHECK_VALUE(steps >= 0 && steps < 0x1p63, "resolve_steps: ", detail::repr(steps),
                    " is not a number of steps: it must lie in [0, ", detail::kMaxCount, "]");
  TORCH_CHECK_VALUE(max_steps >= 0, "resolve_steps: max_steps must be non-negative, got ",
                    max_steps);
  // A ratio below 1 of at most 2^63 steps stays below 2^63.
  if (steps < 1) return static_cast<int64_t>(std::ceil(steps * static_cast<double>(max_steps)));
  return static_cast<int64_t>(steps);
}

int64_t TrainingArguments::get_warmup_steps(int64_t num_training_steps) const {
  if (warmup_steps_ > 0) return warmup_steps_;
  // In double, a run near 2^63 steps rounds up to 2^63, one past int64: then the warmup is the
  // whole run (warmup_ratio <= 1).
  const double steps = std::ceil(static_cast<double>(num_training_steps) * warmup_ratio_);
  return detail::fits_int64(steps) ? static_cast<int64_t>(steps) : num_training_steps;
}

bool TrainingArguments::operator==(const TrainingArguments& other) const {
#define MANTISSA_TA_EQ_(type, name, default_value, help) \
  if (!(name##_ == other.name##_)) return false;
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_EQ_)
#undef MANTISSA_TA_EQ_
  return true;
}

}  // namespace mantissa
