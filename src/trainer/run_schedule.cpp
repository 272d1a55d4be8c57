#include "trainer/run_schedule.h"

#include <algorithm>
#include <cmath>

#include <c10/util/Exception.h>

namespace mantissa::detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

RunSchedule make_run_schedule(std::int64_t num_examples, const TrainingArguments& args) {
  const auto n = num_examples;
  const auto batch_size = args.per_device_train_batch_size();
  TORCH_CHECK_VALUE(n > 0, "the training dataset is empty: there is nothing to train on");
  TORCH_CHECK_VALUE(!(args.dataloader_drop_last() && batch_size > n),
                    "per_device_train_batch_size (", batch_size,
                    ") is larger than the training dataset (", n,
                    " examples) and dataloader_drop_last is set: no batch would be produced");
  RunSchedule s;
  s.num_examples = n;
  s.batch_size = batch_size;
  s.gradient_accumulation_steps = args.gradient_accumulation_steps();
  s.batches_per_epoch = args.dataloader_drop_last() ? n / batch_size : ceil_div(n, batch_size);
  s.updates_per_epoch =
      std::max<std::int64_t>(ceil_div(s.batches_per_epoch, s.gradient_accumulation_steps), 1);
  if (args.max_steps() > 0) {
    s.max_steps = args.max_steps();
    s.num_epochs = ceil_div(s.max_steps, s.updates_per_epoch);
  } else {
    s.max_steps = static_cast<std::int64_t>(
        std::ceil(args.num_train_epochs() * static_cast<double>(s.updates_per_epoch)));
    s.num_epochs = static_cast<std::int64_t>(std::ceil(args.num_train_epochs()));
  }
  TORCH_CHECK_VALUE(s.max_steps > 0, "this run would take no optimizer step (num_train_epochs=",
                    args.num_train_epochs(), ", max_steps=", args.max_steps(), ")");
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
  for (auto i = b * batch_size; i < std::min(num_examples, (b + 1) * batch_size); ++i) {
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
