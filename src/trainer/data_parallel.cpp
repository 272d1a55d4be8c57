#include "trainer/data_parallel.h"

#include <fmt/format.h>
#include <torch/serialize.h>

#include <mantissa/distributed.h>

#include "io/filesystem.h"
#include "io/torch_load.h"

namespace mantissa::detail {

DataParallel::DataParallel(std::shared_ptr<Collectives> collectives, const TrainingArguments& args)
    : collectives_(std::move(collectives)), args_(args) {
  collectives_->check_same_arguments(args_);
}

DataParallel::~DataParallel() = default;

bool DataParallel::should_save() const {
  return is_main_process() || (args_.save_on_each_node() && is_local_main_process());
}

bool DataParallel::should_log() const {
  return args_.log_on_each_node() ? is_local_main_process() : is_main_process();
}

std::string DataParallel::describe() const {
  return fmt::format(" x {} processes ({}, rank {})", world_size(),
                     distributed::backend_name(collectives_->backend()), rank());
}

std::vector<double> DataParallel::sum(std::vector<double> values) const {
  return collectives_->sum(std::move(values));
}

bool DataParallel::passed_everywhere(const std::function<void()>& check) const {
  return collectives_->passed_everywhere(check);
}

std::string DataParallel::broadcast(const std::string& bytes) const {
  return collectives_->broadcast_bytes(bytes);
}

void DataParallel::check_same_text(const std::string& value, const std::string& what) const {
  collectives_->check_same_text(value, what);
}

void DataParallel::max_all_reduce_(torch::Tensor& tensor) const {
  collectives_->guarded("taking the maximum over the processes", [&] {
    const bool elsewhere = tensor.device() != collectives_->device();
    std::vector<torch::Tensor> tensors{elsewhere ? tensor.to(collectives_->device()) : tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MAX;
    collectives_->group()->allreduce(tensors, options)->wait();
    if (elsewhere) tensor.copy_(tensors[0]);
  });
}

std::int64_t DataParallel::examples_per_process(std::int64_t num_examples, bool drop_last) const {
  return static_cast<std::int64_t>(
      distributed::distributed_sampler_indices(num_examples, world_size(), rank(), 0, 0,
                                               /*shuffle=*/false, drop_last)
          .size());
}

torch::Tensor DataParallel::epoch_order(std::int64_t num_examples, std::uint64_t seed,
                                        std::int64_t epoch, bool drop_last) const {
  return torch::tensor(distributed::distributed_sampler_indices(
                           num_examples, world_size(), rank(), seed,
                           static_cast<std::uint64_t>(epoch), /*shuffle=*/true, drop_last),
                       torch::kLong);
}

torch::Tensor DataParallel::gather_rows(const torch::Tensor& rows, std::int64_t num_examples,
                                        double padding_value) const {
  return collectives_->gather_rows(rows, num_examples, padding_value);
}

void DataParallel::agree_on_model(torch::nn::Module& module, bool with_buffers) const {
  collectives_->check_same_parameters(module);
  collectives_->broadcast_module_states(module, with_buffers);
}

std::optional<std::string> DataParallel::gradient_checkpointing_blocker() const {
  if (!args_.resolved_ddp_find_unused_parameters()) return std::nullopt;
  return fmt::format(
      "across {} processes needs --ddp_find_unused_parameters false: the search for unused "
      "parameters cannot see the parameters of the recomputed blocks",
      world_size());
}

void DataParallel::prepare_model(torch::nn::Module& module) {
  agree_on_model(module, args_.resolved_ddp_broadcast_buffers());
  gradient_sync_ = std::make_unique<GradientSync>(*collectives_, module, args_);
}

void DataParallel::before_forward(bool sync) {
  TORCH_INTERNAL_ASSERT(gradient_sync_ != nullptr, "DataParallel: prepare_model was not called");
  gradient_sync_->before_forward(sync);
}

void DataParallel::before_backward(const torch::Tensor& loss, bool sync) {
  gradient_sync_->before_backward(loss, sync);
}

bool DataParallel::run_step(const std::function<bool()>& step) const {
  return collectives_->guarded("averaging the gradients", step);
}

std::optional<std::string> DataParallel::cuda_graph_blocker() const {
  return std::string(
      "this run averages gradients across processes, and c10d::Reducer does that from autograd "
      "hooks and host-side bucket bookkeeping on every backward, which a captured graph would "
      "not replay");
}

void DataParallel::copy_scaler_from_rank0(amp::GradScaler& scaler) const {
  if (!scaler.is_enabled()) return;
  const auto mine = torch::pickle_save(c10::IValue(scaler.state_dict()));
  const auto rank0 = collectives_->broadcast_bytes(std::string(mine.begin(), mine.end()));
  if (rank() == 0) return;
  scaler.load_state_dict(
      io::load_torch_bytes(std::vector<char>(rank0.begin(), rank0.end())).toGenericDict());
}

void DataParallel::save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) {
  const auto& dp = *collectives_;
  const auto step = parts.state->global_step;
  const bool writer = should_save();
  const auto folder = shared_checkpoint_folder(output_dir, step);
  // Where a process without a writer of its own adds its random state: rank 0's folder (its
  // output_dir may differ from this process's; on a shared file system it is visible here).
  const auto rank0_folder = dp.broadcast_bytes(folder);
  std::string error;
  const auto attempt = [&error](const auto& body) {
    if (!error.empty()) return;
    try {
      body();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  const auto agreed = [&](const char* stage) {
    if (dp.all_ok(error.empty())) return;
    if (writer) abandon_checkpoint(folder);
    TORCH_CHECK(false, "rank ", dp.rank(), ": saving ", checkpoint_name(step), " failed while ",
                stage,
                error.empty() ? std::string(" on another process (see its error)") : ": " + error);
  };
  if (writer) {
    attempt([&] {
      begin_checkpoint(output_dir, step, /*shared_name=*/true);
      write_checkpoint_files(folder, parts);
    });
  }
  agreed("writing the model, optimizer and state");
  attempt([&] {
    const auto& target = io::is_directory(folder) ? folder : rank0_folder;
    if (io::is_directory(target)) {
      write_rng_state(target, dp.rank(), dp.world_size());
    } else {
      // A node that has no writer and does not share rank 0's file system.
      TORCH_WARN_ONCE("rank ", dp.rank(), ": no checkpoint folder is visible to this process ('",
                      folder, "' nor rank 0's '", rank0_folder,
                      "'), so its random state is not saved; a resume starts it afresh");
    }
  });
  agreed("writing each process's random state");
  if (writer) attempt([&] { publish_checkpoint(output_dir, folder, step); });
  agreed("moving the checkpoint into place");
}

void DataParallel::load_checkpoint(const std::string& dir, const CheckpointParts& parts) {
  // Every process learns whether all loaded, so none trains on while another has stopped.
  const bool loaded = passed_everywhere([&] { detail::load_checkpoint(dir, parts); });
  TORCH_CHECK_VALUE(loaded, "rank ", rank(), ": cannot resume from '", dir,
                    "': another process could not load it (see its error)");
}

}  // namespace mantissa::detail
