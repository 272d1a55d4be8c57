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
//     Started wrongly on purpose, every rank must fail, each with a message that contains
//     --expect-error TEXT and no C++ backtrace ("frame #"): --world-size-of-rank R N tells rank
//     R that the world has N ranks, --master-addr A gives every rank MASTER_ADDR=A, and
//     --without-rank0 starts every rank but rank 0 (nobody hosts the store).
//   distributed_check rank [--die-after-init] [--timeout-s S] [--nccl]
//     one rank: an allreduce (sum), a broadcast from rank 0, an allgather, the Trainer's
//     gather and scatter of bytes (src/trainer/collectives.h) and a barrier, each result
//     compared with what it must be. With --nccl over NCCL on cuda:LOCAL_RANK (exit 77,
//     CTest's skip, without a CUDA device).
//
// Exit status: 0 when everything came out as expected.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <mantissa/distributed.h>

#include "trainer/collectives.h"

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
  auto group = dist::init_process_group(env, nccl ? dist::Backend::kNccl : dist::Backend::kGloo,
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

  // The Trainer's byte transfers (src/trainer/collectives.h), of a different length on each
  // rank, one of them empty: gathered on rank 0 in rank order, and scattered back, each rank
  // getting its own.
  const mantissa::detail::Collectives collectives(env, nccl ? dist::Backend::kNccl
                                                            : dist::Backend::kGloo,
                                                  group, device, std::chrono::seconds(timeout_s));
  const auto bytes_of = [](int64_t r) {
    return r == 1 ? std::string() : std::string(static_cast<std::size_t>(3 + 5 * r), char('a' + r));
  };
  const auto all = collectives.gather_bytes(bytes_of(env.rank));
  bool gathered_ok = all.size() == static_cast<std::size_t>(env.rank == 0 ? world : 0);
  for (std::size_t r = 0; gathered_ok && r < all.size(); ++r) {
    gathered_ok = all[r] == bytes_of(static_cast<int64_t>(r));
  }
  if (!gathered_ok) std::cout << "rank " << env.rank << ": gather_bytes WRONG" << std::endl;
  ok &= gathered_ok;
  std::vector<std::string> back;
  for (int64_t r = 0; env.rank == 0 && r < world; ++r) back.push_back(bytes_of(world - 1 - r));
  const auto own = collectives.scatter_bytes(back);
  if (own != bytes_of(world - 1 - env.rank)) {
    std::cout << "rank " << env.rank << ": scatter_bytes WRONG (" << own.size() << " bytes)"
              << std::endl;
    ok = false;
  }

  group->barrier()->wait();
  std::cout << "rank " << env.rank << (ok ? ": all collectives correct" : ": WRONG RESULTS")
            << std::endl;
  return ok ? 0 : 1;
}

// How to start the ranks wrongly, and what every rank must then say.
struct Miscast {
  int rank = -1;  // --world-size-of-rank R N: rank R is told WORLD_SIZE=N
  int told_world = 0;
  std::string master_addr;  // --master-addr A
  bool without_rank0 = false;
  std::string expect_error;  // --expect-error TEXT; empty: the job must succeed
};

// A fresh folder under $TMPDIR (or /tmp) for the ranks' output.
std::string temp_directory() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/distributed-check-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every rank failed (did not hang), and each one's output names the mistake without a backtrace.
bool check_miscast(const Miscast& miscast, const std::vector<int>& ranks,
                   const std::vector<int>& status, const std::vector<std::string>& outputs) {
  bool ok = true;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const auto text = read_text(outputs[i]);
    std::cout << "launcher: rank " << ranks[i] << " exited with " << status[i] << ", saying:\n"
              << text << std::endl;
    ok &= status[i] != 0 && status[i] != -1;
    if (text.find(miscast.expect_error) == std::string::npos) {
      std::cout << "launcher: rank " << ranks[i] << " did not say '" << miscast.expect_error << "'"
                << std::endl;
      ok = false;
    }
    if (text.find("frame #") != std::string::npos) {
      std::cout << "launcher: rank " << ranks[i] << " printed a C++ backtrace" << std::endl;
      ok = false;
    }
  }
  return ok;
}

int spawn(int world_size, bool agent_store, int kill_rank, int deadline_s, bool nccl,
          const Miscast& miscast) {
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
  std::vector<int> ranks;
  std::vector<std::string> outputs;
  const bool miscast_run = !miscast.expect_error.empty();
  const std::string output_dir = miscast_run ? temp_directory() : "";
  for (int rank = 0; rank < world_size; ++rank) {
    if (miscast.without_rank0 && rank == 0) continue;
    std::vector<std::string> env = base;
    const int told = rank == miscast.rank ? miscast.told_world : world_size;
    for (auto kv : mt::rank_variables(rank, told, port)) {
      if (!miscast.master_addr.empty() && kv.rfind("MASTER_ADDR=", 0) == 0) {
        kv = "MASTER_ADDR=" + miscast.master_addr;
      }
      env.push_back(kv);
    }
    if (agent_store) {
      env.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
      env.push_back("TORCHELASTIC_RESTART_COUNT=0");
    }
    std::vector<std::string> args = {"distributed_check", "rank", "--timeout-s",
                                     std::to_string(deadline_s / 2)};
    if (rank == kill_rank) args.push_back("--die-after-init");
    if (nccl) args.push_back("--nccl");
    try {
      outputs.push_back(miscast_run ? output_dir + "/rank" + std::to_string(rank) + ".txt" : "");
      pids.push_back(mt::start_process("/proc/self/exe", args, env, outputs.back()));
      ranks.push_back(rank);
    } catch (const std::exception& e) {
      std::cerr << "launcher: rank " << rank << ": " << e.what() << std::endl;
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return 1;
    }
  }

  const auto status = mt::wait_for(pids, deadline_s);
  if (miscast_run) {
    const bool ok = check_miscast(miscast, ranks, status, outputs);
    std::cout << "launcher: " << (ok ? "PASSED" : "FAILED") << std::endl;
    return ok ? 0 : 1;
  }
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
      Miscast miscast;
      for (size_t i = 0; i + 1 < args.size(); ++i) {
        if (args[i] == "--master-addr") miscast.master_addr = args[i + 1];
        if (args[i] == "--expect-error") miscast.expect_error = args[i + 1];
        if (args[i] == "--world-size-of-rank" && i + 2 < args.size()) {
          miscast.rank = std::stoi(args[i + 1]);
          miscast.told_world = std::stoi(args[i + 2]);
        }
      }
      miscast.without_rank0 = flag("--without-rank0");
      return spawn(number("--world-size", std::max(default_world, 1)), flag("--agent-store"),
                   number("--kill-rank", -1), number("--deadline-s", 60), flag("--nccl"), miscast);
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
