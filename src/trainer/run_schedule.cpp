#include "trainer/run_schedule.h"

#include <algorithm>
#include <cmath>

#include <c10/util/Exception.h>

#include "checked_math.h"

namespace mantissa::detail {

RunSchedule make_run_schedule(std::size_t dataset_size, const TrainingArguments& args) {
  TORCH_CHECK_VALUE(dataset_size > 0,
                    "the training dataset is empty: there is nothing to train on");
  TORCH_CHECK_VALUE(dataset_size <= static_cast<std::size_t>(kMaxCount),
                    "the training dataset has ", dataset_size,
                    " examples, more than a 64-bit count holds (at most ", kMaxCount, ")");
  const auto n = static_cast<std::int64_t>(dataset_size);
  const auto batch_size = args.per_device_train_batch_size();
  const auto accumulation = args.gradient_accumulation_steps();
  TORCH_CHECK_VALUE(!(args.dataloader_drop_last() && batch_size > n),
                    "per_device_train_batch_size (", batch_size,
                    ") is larger than the training dataset (", n,
                    " examples) and dataloader_drop_last is set: no batch would be produced");
  RunSchedule s;
  s.num_examples = n;
  s.batch_size = batch_size;
  s.gradient_accumulation_steps = accumulation;
  s.batches_per_epoch = args.dataloader_drop_last() ? n / batch_size : ceil_div(n, batch_size);
  s.updates_per_epoch = std::max<std::int64_t>(ceil_div(s.batches_per_epoch, accumulation), 1);
  if (args.max_steps() > 0) {
    s.max_steps = args.max_steps();
    s.num_epochs = ceil_div(s.max_steps, s.updates_per_epoch);
  } else {
    const double epochs = args.num_train_epochs();
    const double steps = std::ceil(epochs * static_cast<double>(s.updates_per_epoch));
    TORCH_CHECK_VALUE(fits_int64(steps) && fits_int64(std::ceil(epochs)), "--num_train_epochs ",
                      epochs, " of ", s.updates_per_epoch,
                      " optimizer steps each is more optimizer steps than a 64-bit count holds "
                      "(at most ",
                      kMaxCount, ")");
    s.max_steps = static_cast<std::int64_t>(steps);
    s.num_epochs = static_cast<std::int64_t>(std::ceil(epochs));
  }
  TORCH_CHECK_VALUE(s.max_steps > 0, "this run would take no optimizer step (num_train_epochs=",
                    args.num_train_epochs(), ", max_steps=", args.max_steps(), ")");
  // The examples the run draws (its nominal count: max_steps full accumulation groups).
  const auto per_step = checked_mul(batch_size, accumulation);
  const bool examples_fit = per_step && checked_mul(s.max_steps, *per_step);
  if (args.max_steps() > 0) {
    TORCH_CHECK_VALUE(examples_fit, "--max_steps ", s.max_steps,
                      " optimizer steps of --per_device_train_batch_size ", batch_size,
                      " x --gradient_accumulation_steps ", accumulation,
                      " examples each is more examples than a 64-bit count holds (at most ",
                      kMaxCount, ")");
  } else {
    TORCH_CHECK_VALUE(examples_fit, "--num_train_epochs ", args.num_train_epochs(), " (",
                      s.max_steps, " optimizer steps) of --per_device_train_batch_size ",
                      batch_size, " x --gradient_accumulation_steps ", accumulation,
                      " examples each is more examples than a 64-bit count holds (at most ",
                      kMaxCount, ")");
  }
  return s;
}

GroupPosition RunSchedule::group_of(std::int64_t b) const {
  const auto accumulation = gradient_accumulation_steps;
  GroupPosition p;
  p.group_start = (b / accumulation) * accumulation;
  p.in_group = std::min(accumulation, batches_per_epoch - p.group_start);
  p.boundary = b == p.group_start + p.in_group - 1;
  return p;
}

std::vector<std::size_t> RunSchedule::batch_indices(const std::int64_t* order,
                                                    std::int64_t b) const {
  std::vector<std::size_t> indices;
  const auto begin = b * batch_size;  // < num_examples: b < batches_per_epoch
  for (auto i = begin; i < begin + std::min(batch_size, num_examples - begin); ++i) {
    indices.push_back(static_cast<std::size_t>(order[i]));
  }
  return indices;
}

double RunSchedule::fractional_epoch(std::int64_t epoch, std::int64_t b) const {
  return static_cast<double>(epoch) +
         static_cast<double>(b + 1) / static_cast<double>(batches_per_epoch);
}

RunShape RunSchedule::run_shape() const {
  return {batches_per_epoch, updates_per_epoch, gradient_accumulation_steps, batch_size};
}

}  // namespace mantissa::detail
