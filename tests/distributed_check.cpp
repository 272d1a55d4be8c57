// Two (or more) real processes joined by mantissa::distributed::init_process_group over Gloo on
// 127.0.0.1. One executable plays both parts:
//
//   distributed_check spawn [--world-size N] [--agent-store] [--kill-rank R] [--deadline-s S]
//                           [--nccl]   (NCCL: N defaults to $MANTISSA_NCCL_RANKS, else 1)
//     the launcher: finds a free port, starts N copies of itself as "rank" with RANK, WORLD_SIZE,
//     LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set as torchrun sets them, and
//     checks how they end. With --agent-store it hosts the TCPStore itself and sets
//     TORCHELASTIC_USE_AGENT_STORE=True, as torchrun's agent does. With --kill-rank R, rank R
//     exits right after joining, and every other rank must then fail (exit non-zero) instead of
//     hanging. Ranks still running at the deadline are killed and the check fails.
//   distributed_check rank [--die-after-init] [--timeout-s S] [--nccl]
//     one rank: an allreduce (sum), a broadcast from rank 0, an allgather and a barrier, each
//     result compared with what it must be. With --nccl over NCCL on cuda:LOCAL_RANK (exit 77,
//     CTest's skip, without a CUDA device).
//
// Exit status: 0 when everything came out as expected.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <mantissa/distributed.h>

#include "multiprocess.h"

namespace {

namespace dist = mantissa::distributed;

constexpr int kDiedOnPurpose = 3;
constexpr int kNoCuda = 77;  // CTest's SKIP_RETURN_CODE for the NCCL check

bool same(const at::Tensor& got_anywhere, const at::Tensor& want, const std::string& what,
          int64_t rank) {
  const auto got = got_anywhere.cpu();
  if (torch::equal(got, want)) return true;
  std::cerr << "rank " << rank << ": " << what << " gave " << got << " instead of " << want
            << std::endl;
  return false;
}

int run_rank(bool die_after_init, int timeout_s, bool nccl) {
  const auto env = dist::DistributedEnvironment::from_env();
  // NCCL works on the process's CUDA device, which must be selected before joining.
  const auto device = nccl ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank))
                           : c10::Device(c10::kCPU);
  if (nccl) {
    if (!torch::cuda::is_available()) {
      std::cout << "rank " << env.rank << ": no CUDA device, the NCCL check cannot run"
                << std::endl;
      return kNoCuda;
    }
    c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
  }
  auto group = dist::init_process_group(env, nccl ? dist::Backend::nccl : dist::Backend::gloo,
                                        std::chrono::seconds(timeout_s));
  std::cout << "rank " << env.rank << " of " << env.world_size << " joined (agent store "
            << (env.use_agent_store ? "yes" : "no") << ", " << (nccl ? "nccl" : "gloo") << ")"
            << std::endl;
  if (die_after_init) {
    std::cout << "rank " << env.rank << " leaves without a word" << std::endl;
    std::_Exit(kDiedOnPurpose);
  }
  const int64_t world = env.world_size;
  bool ok = true;

  // allreduce: rank r contributes (r + 1) * [1, 2, 3]; the sum is W (W + 1) / 2 * [1, 2, 3].
  std::vector<at::Tensor> sum{(torch::tensor({1.f, 2.f, 3.f}) * float(env.rank + 1)).to(device)};
  group->allreduce(sum)->wait();
  ok &= same(sum[0], torch::tensor({1.f, 2.f, 3.f}) * float(world * (world + 1) / 2), "allreduce",
             env.rank);

  // broadcast from rank 0: every rank ends with rank 0's tensor.
  std::vector<at::Tensor> shared{
      (env.rank == 0 ? torch::arange(5, torch::kLong) * 10 : torch::full({5}, -1, torch::kLong))
          .to(device)};
  group->broadcast(shared)->wait();
  ok &= same(shared[0], torch::arange(5, torch::kLong) * 10, "broadcast", env.rank);

  // allgather: slot r holds rank r's value.
  std::vector<std::vector<at::Tensor>> gathered(1);
  const auto ints = torch::TensorOptions().dtype(torch::kInt).device(device);
  for (int64_t r = 0; r < world; ++r) gathered[0].push_back(torch::empty({1}, ints));
  std::vector<at::Tensor> mine{torch::full({1}, int(env.rank * 7), ints)};
  group->allgather(gathered, mine)->wait();
  for (int64_t r = 0; r < world; ++r) {
    ok &= same(gathered[0][r], torch::full({1}, int(r * 7), torch::kInt), "allgather", env.rank);
  }

  group->barrier()->wait();
  std::cout << "rank " << env.rank << (ok ? ": all collectives correct" : ": WRONG RESULTS")
            << std::endl;
  return ok ? 0 : 1;
}

int spawn(int world_size, bool agent_store, int kill_rank, int deadline_s, bool nccl) {
  namespace mt = mantissa::testing;
  c10::intrusive_ptr<c10d::TCPStore> agent;  // lives until the ranks are done
  uint16_t port = 0;
  if (agent_store) {
    c10d::TCPStoreOptions options;
    options.port = 0;  // the store picks a free port itself: no race with other tests
    options.isServer = true;
    options.waitWorkers = false;
    agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    port = agent->getPort();
  } else {
    port = mt::free_port();
  }
  std::cout << "launcher: " << world_size << " ranks, store on 127.0.0.1:" << port
            << (agent_store ? " (hosted by the launcher)" : " (hosted by rank 0)") << std::endl;

  const auto base = mt::environment_without_launcher_variables();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<std::string> env = base;
    for (const auto& kv : mt::rank_variables(rank, world_size, port)) env.push_back(kv);
    if (agent_store) {
      env.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
      env.push_back("TORCHELASTIC_RESTART_COUNT=0");
    }
    std::vector<std::string> args = {"distributed_check", "rank", "--timeout-s",
                                     std::to_string(deadline_s / 2)};
    if (rank == kill_rank) args.push_back("--die-after-init");
    if (nccl) args.push_back("--nccl");
    try {
      pids.push_back(mt::start_process("/proc/self/exe", args, env));
    } catch (const std::exception& e) {
      std::cerr << "launcher: rank " << rank << ": " << e.what() << std::endl;
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return 1;
    }
  }

  const auto status = mt::wait_for(pids, deadline_s);
  if (std::all_of(status.begin(), status.end(), [](int s) { return s == kNoCuda; })) {
    std::cout << "launcher: SKIPPED (no CUDA device for NCCL)" << std::endl;
    return kNoCuda;
  }
  bool ok = true;
  for (int rank = 0; rank < world_size; ++rank) {
    if (status[rank] == -1) {
      ok = false;
      continue;
    }
    std::cout << "launcher: rank " << rank << " exited with " << status[rank] << std::endl;
    if (kill_rank < 0) {
      ok &= status[rank] == 0;
    } else if (rank == kill_rank) {
      ok &= status[rank] == kDiedOnPurpose;
    } else {
      ok &= status[rank] != 0 && status[rank] != kDiedOnPurpose;  // noticed, did not hang
    }
  }
  std::cout << "launcher: " << (ok ? "PASSED" : "FAILED") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto flag = [&](const std::string& name) {
    for (const auto& a : args) {
      if (a == name) return true;
    }
    return false;
  };
  auto number = [&](const std::string& name, int fallback) {
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == name) return std::stoi(args[i + 1]);
    }
    return fallback;
  };
  try {
    if (!args.empty() && args[0] == "rank") {
      return run_rank(flag("--die-after-init"), number("--timeout-s", 30), flag("--nccl"));
    }
    if (!args.empty() && args[0] == "spawn") {
      // NCCL: one rank per GPU, as many as scripts/gpu-check found (MANTISSA_NCCL_RANKS).
      const char* gpus = std::getenv("MANTISSA_NCCL_RANKS");
      const int default_world = flag("--nccl") ? (gpus != nullptr ? std::atoi(gpus) : 1) : 2;
      return spawn(number("--world-size", std::max(default_world, 1)), flag("--agent-store"),
                   number("--kill-rank", -1), number("--deadline-s", 60), flag("--nccl"));
    }
    std::cerr << "usage: distributed_check spawn [--world-size N] [--agent-store] "
                 "[--kill-rank R] [--deadline-s S] | rank [--die-after-init] [--timeout-s S]"
              << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
}
