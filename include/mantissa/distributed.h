#pragma once
// Data parallelism, first layer: where this process sits in the job (read from the variables a
// launcher sets), the c10d process group the ranks talk through, and how the training set is
// split between the ranks. Gradient synchronisation inside the Trainer builds on these.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <mantissa/distributed_backend.h>

namespace mantissa::distributed {

/// Looks up one environment variable: the value, or `std::nullopt` when it is not set.
/// `std::getenv` in production; a map in tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// This process's place in a data-parallel job, as `torchrun`, a Slurm script or `mpirun`
/// describe it through the environment (the variables Python's `init_method="env://"` reads,
/// plus torchrun's elastic-agent ones). With neither `RANK` nor `WORLD_SIZE` set the process
/// runs alone: rank 0 of a world of 1.
struct DistributedEnvironment {
  int64_t rank = 0;              ///< `RANK`: global rank, in [0, world_size)
  int64_t world_size = 1;        ///< `WORLD_SIZE`: number of processes in the job
  int64_t local_rank = 0;        ///< `LOCAL_RANK` (default: `RANK`): rank on this node
  int64_t local_world_size = 1;  ///< `LOCAL_WORLD_SIZE` (default: `WORLD_SIZE`)
  std::string master_addr;       ///< `MASTER_ADDR`: host of the TCPStore
  uint16_t master_port = 0;      ///< `MASTER_PORT`: its port
  /// `TORCHELASTIC_USE_AGENT_STORE == "True"`: torchrun's agent already hosts the store, so
  /// every rank connects as a client (`torch/distributed/rendezvous.py`).
  bool use_agent_store = false;
  int64_t restart_count = 0;  ///< `TORCHELASTIC_RESTART_COUNT`: which attempt this is
  /// `GLOO_SOCKET_IFNAME`: network interface(s) for Gloo, comma-separated; empty: the one this
  /// host's name resolves to (Python's default too).
  std::string gloo_socket_ifname;

  /// More than one process.
  bool is_distributed() const { return world_size > 1; }
  /// Rank 0: the process that logs and saves (HF's `is_world_process_zero`).
  bool is_main_process() const { return rank == 0; }
  /// Local rank 0: the first process on its node (HF's `is_local_process_zero`).
  bool is_local_main_process() const { return local_rank == 0; }

  /// Reads the variables through `lookup`. Throws `c10::ValueError` naming the variable and its
  /// value for an inconsistent or malformed set: `RANK` without `WORLD_SIZE` or the reverse, a
  /// non-integer, a rank outside [0, world_size), a world size below 1, a port outside
  /// [1, 65535], or a world size above 1 without `MASTER_ADDR` / `MASTER_PORT`.
  static DistributedEnvironment from_lookup(const EnvLookup& lookup);
  /// `from_lookup` over this process's environment (`std::getenv`).
  static DistributedEnvironment from_env();
};

// Backend and backend_name: include/mantissa/distributed_backend.h.

/// Joins the job described by `env` and returns its process group: the c10d object Python's
/// `torch.distributed.init_process_group(backend, init_method="env://", timeout=...)` creates
/// and `c10d::Reducer` takes. Rank 0 hosts a `c10d::TCPStore` on `MASTER_PORT` and the other
/// ranks connect to it; under torchrun's agent (`use_agent_store`) every rank is a client, under
/// `PrefixStore("/worker/attempt_<restart_count>")`. A world of 1 without `MASTER_ADDR` uses an
/// in-process store, so a lone process gets a working group of one.
///
/// Blocks until every rank has connected; throws when that, or any later collective, takes
/// longer than `timeout` (HF's `ddp_timeout`, 1800 s). Gloo binds to `gloo_socket_ifname`, or to
/// the address this host's name resolves to. NCCL needs the caller to select the process's CUDA
/// device (`cuda:<local_rank>`) first.
c10::intrusive_ptr<c10d::ProcessGroup> init_process_group(
    const DistributedEnvironment& env, Backend backend = Backend::kGloo,
    std::chrono::milliseconds timeout = std::chrono::seconds(1800));

/// The example indices rank `rank` of `world_size` visits in epoch `epoch`, exactly those of
/// Python's `torch.utils.data.DistributedSampler(dataset, world_size, rank, shuffle, seed,
/// drop_last)` after `set_epoch(epoch)`: the indices 0..num_examples-1, shuffled with a CPU
/// generator seeded `seed + epoch` (`torch.randperm`) when `shuffle`, then padded by repeating
/// from the start up to a multiple of `world_size`, or with `drop_last` cut down to one, and
/// finally every `world_size`-th one starting at `rank`. Every rank gets the same count.
/// Throws `c10::ValueError` for a negative size, a world size below 1 or a rank outside
/// [0, world_size). Does not touch the global generator.
std::vector<int64_t> distributed_sampler_indices(int64_t num_examples, int64_t world_size,
                                                 int64_t rank, uint64_t seed = 0,
                                                 uint64_t epoch = 0, bool shuffle = true,
                                                 bool drop_last = false);

}  // namespace mantissa::distributed
