#pragma once
// The process group of a job that a launcher started as several processes, and the collectives
// the data-parallel strategy needs besides gradient sync (which is c10d::Reducer's job, in
// trainer/gradient_sync.h): copying rank 0's state to every rank, checking that the ranks
// agree, summing log values and gathering evaluation rows. One per process, shared by every
// Trainer of the process (as Python's default process group).
//
// The methods that take or return data are collectives: all ranks must call them, in the same
// order. A failure (a peer that exited, or one that stopped answering for `ddp_timeout`) raises
// a c10::Error that names this rank and what it was doing.

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <mantissa/distributed.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// Part of every message of `Collectives::failure_message`; an error that holds it is not
/// wrapped again.
inline constexpr const char* kFailureMark = "Another process of the job";

/// The job's process group, where this process sits in it, and the collectives over it.
class Collectives {
 public:
  /// Joins the job `env` (the launcher's variables) describes when it has more than one
  /// process (`WORLD_SIZE` > 1); returns null for a lone process. The backend is
  /// `args.resolved_ddp_backend(device)`; nccl needs a CUDA `device`, which becomes this
  /// process's current device. A process joins once: later Trainers share the group (as
  /// Python's default process group), and asking for another backend then is an error.
  /// Python: what accelerate does for HF's `TrainingArguments`.
  static std::shared_ptr<Collectives> join_if_launched(distributed::DistributedEnvironment env,
                                                       const TrainingArguments& args,
                                                       const c10::Device& device);

  Collectives(distributed::DistributedEnvironment env, distributed::Backend backend,
              c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device,
              std::chrono::milliseconds timeout);

  const distributed::DistributedEnvironment& env() const noexcept { return env_; }
  std::int64_t rank() const noexcept { return env_.rank; }
  std::int64_t world_size() const noexcept { return env_.world_size; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const noexcept { return group_; }
  /// `gloo` or `nccl`.
  distributed::Backend backend() const noexcept { return backend_; }
  /// Where the collectives' tensors live: the CPU for gloo, the CUDA device for nccl.
  const c10::Device& device() const noexcept { return device_; }

  /// Stops every rank, with an error naming the fields and ranks, when some rank's arguments
  /// differ from rank 0's in what they compute (where a process writes and how it loads data
  /// may differ: `is_execution_detail`).
  void check_same_arguments(const TrainingArguments& args) const;
  /// Stops every rank when the models' parameters differ in number, name, shape or dtype (what
  /// DDP's constructor checks with `c10d::verify_params_across_processes`), naming the first
  /// parameter that differs.
  void check_same_parameters(const torch::nn::Module& module) const;
  /// Stops every rank when `value` (a short description, such as the checkpoint resumed) is
  /// not the same everywhere; `what` names it in the error.
  void check_same_text(const std::string& value, const std::string& what) const;
  /// Overwrites every rank's parameters (and buffers when `with_buffers`) with rank 0's, in
  /// buckets of `bucket_bytes` (250 MiB by default, DDP's), each a transient copy on every rank.
  /// Python: DDP's `_sync_module_states`.
  void broadcast_module_states(torch::nn::Module& module, bool with_buffers,
                               std::size_t bucket_bytes = 250 * 1024 * 1024) const;
  /// Overwrites `tensors` with rank `root`'s, in place, in coalesced buckets.
  void broadcast_tensors(const std::vector<torch::Tensor>& tensors, std::int64_t root = 0) const;
  /// Rank `root`'s `bytes` on every rank (the other ranks' argument is ignored).
  std::string broadcast_bytes(const std::string& bytes, std::int64_t root = 0) const;
  /// Every rank's `bytes` on rank 0, in rank order; an empty list on the other ranks. Each
  /// rank's bytes travel once, to rank 0 alone (one all-gather of the sizes, one gather of the
  /// bytes padded to the longest). Python: `dist.gather_object(obj, object_gather_list, dst=0)`.
  std::vector<std::string> gather_bytes(const std::string& bytes) const;
  /// Rank 0's `for_each_rank[r]` on rank r (the other ranks' argument is ignored; rank 0's must
  /// have one entry per rank). Each entry travels once, to its rank alone. Python:
  /// `dist.scatter_object_list(output, input_list, src=0)`.
  std::string scatter_bytes(const std::vector<std::string>& for_each_rank) const;

  /// The sum over ranks of each element of `values` (a copy; `values` is untouched).
  std::vector<double> sum(std::vector<double> values) const;
  /// Whether `ok` holds on every rank.
  bool all_ok(bool ok) const;
  /// Runs `check` on this rank and returns whether it passed on every rank. Where it raised,
  /// the error is raised again once every rank has been told, so that no rank waits for one that
  /// stopped; the ranks where it passed get false and say why themselves.
  template <typename F>
  bool passed_everywhere(F&& check) const;
  /// The ranks where `differs_here` holds, as "1, 3"; empty when it holds on none.
  std::string differing_ranks(bool differs_here) const;
  /// Every rank's `rows`, interleaved back into the order of the examples they came from: row
  /// k of rank r is example `r + k * world_size`, as `distributed_sampler_indices` without
  /// shuffling hands them out; `num_examples` rows in all. Ranks may hold one row fewer than
  /// others, and dimension 1 may differ (padded with `padding_value`). Python: accelerate's
  /// `gather_for_metrics`.
  torch::Tensor gather_rows(const torch::Tensor& rows, std::int64_t num_examples,
                            double padding_value) const;
  /// Runs `body`, a collective: an error of the collective itself (`is_collective_failure`)
  /// becomes a c10::Error that says which rank failed at `what` and what usually causes it
  /// (another process died or hung for `ddp_timeout`); others pass unchanged.
  template <typename F>
  auto guarded(const char* what, F&& body) const -> decltype(body());

  /// Whether `error` came from the collectives (c10d's own error types, or gloo's and NCCL's
  /// messages) rather than from the step's own code, and is not one of ours already.
  static bool is_collective_failure(const std::exception& error);

  /// The message of `guarded`'s error.
  std::string failure_message(const char* what, const std::string& cause) const;

 private:
  distributed::DistributedEnvironment env_;
  distributed::Backend backend_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::Device device_;
  std::chrono::milliseconds timeout_;
};

template <typename F>
bool Collectives::passed_everywhere(F&& check) const {
  std::exception_ptr failure;
  try {
    check();
  } catch (...) {
    failure = std::current_exception();
  }
  const bool everywhere = all_ok(failure == nullptr);
  if (failure != nullptr) std::rethrow_exception(failure);
  return everywhere;
}

template <typename F>
auto Collectives::guarded(const char* what, F&& body) const -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& error) {  // gloo's own errors are std::runtime_error
    if (!is_collective_failure(error)) throw;
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    TORCH_CHECK(false,
                failure_message(what, c10_error != nullptr ? c10_error->what_without_backtrace()
                                                           : error.what()));
  }
}

}  // namespace mantissa::detail
