#include "trainer/process_group_strategy.h"

#include <fmt/format.h>
#include <torch/serialize.h>

#include <mantissa/distributed.h>

#include "io/torch_load.h"

namespace mantissa::detail {

ProcessGroupStrategy::ProcessGroupStrategy(std::shared_ptr<Collectives> collectives,
                                           const TrainingArguments& args)
    : collectives_(std::move(collectives)), args_(args) {
  collectives_->check_same_arguments(args_);
  checkpoint_io_ = std::make_unique<CollectiveCheckpointIO>(*collectives_, should_save());
}

bool ProcessGroupStrategy::should_save() const {
  return is_main_process() || (args_.save_on_each_node() && is_local_main_process());
}

bool ProcessGroupStrategy::should_log() const {
  return args_.log_on_each_node() ? is_local_main_process() : is_main_process();
}

std::vector<double> ProcessGroupStrategy::sum(std::vector<double> values) const {
  return collectives_->sum(std::move(values));
}

bool ProcessGroupStrategy::passed_everywhere(const std::function<void()>& check) const {
  return collectives_->passed_everywhere(check);
}

std::string ProcessGroupStrategy::broadcast(const std::string& bytes) const {
  return collectives_->broadcast_bytes(bytes);
}

void ProcessGroupStrategy::check_same_text(const std::string& value, const std::string& what) const {
  collectives_->check_same_text(value, what);
}

void ProcessGroupStrategy::max_all_reduce_(torch::Tensor& tensor) const {
  collectives_->guarded("taking the maximum over the processes", [&] {
    const bool elsewhere = tensor.device() != collectives_->device();
    std::vector<torch::Tensor> tensors{elsewhere ? tensor.to(collectives_->device()) : tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MAX;
    collectives_->group()->allreduce(tensors, options)->wait();
    if (elsewhere) tensor.copy_(tensors[0]);
  });
}

std::int64_t ProcessGroupStrategy::examples_per_process(std::int64_t num_examples, bool drop_last) const {
  return static_cast<std::int64_t>(
      distributed::distributed_sampler_indices(num_examples, world_size(), rank(), 0, 0,
                                               /*shuffle=*/false, drop_last)
          .size());
}

torch::Tensor ProcessGroupStrategy::epoch_order(std::int64_t num_examples, std::uint64_t seed,
                                        std::int64_t epoch, bool drop_last) const {
  return torch::tensor(distributed::distributed_sampler_indices(
                           num_examples, world_size(), rank(), seed,
                           static_cast<std::uint64_t>(epoch), /*shuffle=*/true, drop_last),
                       torch::kLong);
}

torch::Tensor ProcessGroupStrategy::gather_rows(const torch::Tensor& rows, std::int64_t num_examples,
                                        double padding_value) const {
  return collectives_->gather_rows(rows, num_examples, padding_value);
}

void ProcessGroupStrategy::agree_on_model(torch::nn::Module& module, bool with_buffers,
                                          std::size_t bucket_bytes) const {
  collectives_->check_same_parameters(module);
  collectives_->broadcast_module_states(module, with_buffers, bucket_bytes);
}

std::optional<std::string> ProcessGroupStrategy::gradient_checkpointing_blocker() const {
  if (!args_.resolved_ddp_find_unused_parameters()) return std::nullopt;
  return fmt::format(
      "across {} processes needs --ddp_find_unused_parameters false: the search for unused "
      "parameters cannot see the parameters of the recomputed blocks",
      world_size());
}

void ProcessGroupStrategy::copy_scaler_from_rank0(amp::GradScaler& scaler) const {
  if (!scaler.is_enabled()) return;
  const auto mine = torch::pickle_save(c10::IValue(scaler.state_dict()));
  const auto rank0 = collectives_->broadcast_bytes(std::string(mine.begin(), mine.end()));
  if (rank() == 0) return;
  scaler.load_state_dict(
      io::load_torch_bytes(std::vector<char>(rank0.begin(), rank0.end())).toGenericDict());
}

}  // namespace mantissa::detail
