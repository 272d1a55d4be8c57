// init_process_group: the store and the backend, laid out as Python's
// torch.distributed.init_process_group(init_method="env://") lays them out.
//
// ProcessGroupGloo.hpp needs gloo's headers, which come from Debian's libgloo-dev and are older
// than the gloo built into the torch wheel. Only the wheel's code may construct gloo objects (two
// definitions of one gloo type would break the one-definition rule), so this file only calls
// ProcessGroupGloo's own factories and never names a gloo type beyond the device pointer.

#include <future>
#include <memory>
#include <sstream>
#include <thread>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(MANTISSA_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "distributed/rendezvous_checks.h"
#include "mantissa/distributed.h"

namespace mantissa::distributed {
namespace {

// A TCPStore client that reaches a program which accepts the connection but never answers (a
// port taken by something else) waits in its handshake without a deadline. The connection is
// therefore made on a thread of its own, and given up on after `timeout`; the abandoned thread
// ends with the process. Written by hand: c10d offers no bounded connect.
c10::intrusive_ptr<c10d::Store> connect_within(const std::string& host,
                                               const c10d::TCPStoreOptions& options,
                                               std::chrono::milliseconds timeout) {
  auto connect = std::make_shared<std::packaged_task<c10::intrusive_ptr<c10d::Store>()>>(
      [host, options] { return c10::make_intrusive<c10d::TCPStore>(host, options); });
  auto connected = connect->get_future();
  std::thread([connect] { (*connect)(); }).detach();
  // A little past the store's own deadline, so that its error (nothing listens) comes first.
  TORCH_CHECK(connected.wait_for(timeout + std::chrono::seconds(5)) == std::future_status::ready,
              "no answer from ", host, ":", options.port, " within ", timeout.count(),
              " ms (whatever listens there is not a store that answers)");
  return connected.get();
}

// torch/distributed/rendezvous.py, _create_c10d_store: the agent's store, or rank 0's.
c10::intrusive_ptr<c10d::Store> create_store(const DistributedEnvironment& env,
                                             std::chrono::milliseconds timeout) {
  if (!env.is_distributed() && env.master_addr.empty()) {
    return c10::make_intrusive<c10d::HashStore>();
  }
  TORCH_CHECK_VALUE(!env.master_addr.empty() && env.master_port != 0,
                    "init_process_group: MASTER_ADDR and MASTER_PORT must both be set (they are '",
                    env.master_addr, "' and ", env.master_port, ")");
  detail::check_master_addr_resolves(env);
  // c10d warns with a C++ backtrace at each failed connect; the error below says it all.
  const detail::QuietC10dWarnings quiet;
  c10d::TCPStoreOptions options;
  options.port = env.master_port;
  options.numWorkers = static_cast<size_t>(env.world_size);
  options.timeout = timeout;
  if (env.use_agent_store) {
    // The agent made a new store for this attempt; the prefix keeps its keys apart.
    options.isServer = false;
    auto store = connect_within(env.master_addr, options, timeout);
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(env.restart_count), store);
  }
  options.isServer = env.rank == 0;
  options.multiTenant = true;
  // Not c10d's count of connected workers: agree_on_world_size waits for each rank by name.
  options.waitWorkers = false;
  try {
    if (options.isServer) return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    return connect_within(env.master_addr, options, timeout);
  } catch (const std::exception& error) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    const std::string cause =
        c10_error != nullptr ? c10_error->what_without_backtrace() : error.what();
    const bool port_taken = cause.find("EADDRINUSE") != std::string::npos;
    TORCH_CHECK(
        false, "rank ", env.rank, " of ", env.world_size,
        env.rank == 0 ? ": cannot host the job's store on " : ": cannot reach the job's store on ",
        env.master_addr, ":", env.master_port,
        env.rank != 0 ? " (is rank 0 running, and MASTER_ADDR an address this host reaches?)"
        : port_taken  ? " (is another program using MASTER_PORT? pick a free one)"
                      : " (did every other process start and reach it in time?)",
        ": ", cause);
  }
}

std::vector<std::string> split_interfaces(const std::string& names) {
  std::vector<std::string> out;
  std::stringstream stream(names);
  std::string name;
  while (std::getline(stream, name, ',')) {
    if (!name.empty()) out.push_back(name);
  }
  return out;
}

c10::intrusive_ptr<c10d::Backend> create_gloo(const DistributedEnvironment& env,
                                              const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Python's ProcessGroupGloo(store, rank, size, timeout): one device per GLOO_SOCKET_IFNAME
  // entry, else the default device (this host's name, the loopback address as a fallback).
  for (const auto& interface : split_interfaces(env.gloo_socket_ifname)) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  }
  if (options->devices.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
      store, static_cast<int>(env.rank), static_cast<int>(env.world_size), options);
  backend->setSequenceNumberForGroup();
  return backend;
}

c10::intrusive_ptr<c10d::Backend> create_nccl(const DistributedEnvironment& env,
                                              const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout) {
#if defined(MANTISSA_WITH_NCCL)
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(
      store, static_cast<int>(env.rank), static_cast<int>(env.world_size), options);
  backend->setSequenceNumberForGroup();
  return backend;
#else
  TORCH_CHECK(false,
              "init_process_group: backend 'nccl' needs a mantissa built with CUDA and the NCCL "
              "headers (nvidia-nccl wheel); this build has neither, use 'gloo'");
#endif
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> init_process_group(const DistributedEnvironment& env,
                                                          Backend backend,
                                                          std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(timeout.count() > 0, "init_process_group: timeout must be positive, but it is ",
                    timeout.count(), " ms");
  auto store = create_store(env, timeout);
  store->setTimeout(timeout);
  if (env.is_distributed()) detail::agree_on_world_size(*store, env, timeout);
  // The key layout of Python's default group (distributed_c10d.py): "default_pg", then the group
  // name "0/", then the device, so a C++ rank and a Python rank could share one store.
  auto group_store = c10::make_intrusive<c10d::PrefixStore>(
      "0/", c10::make_intrusive<c10d::PrefixStore>("default_pg", store));
  const int rank = static_cast<int>(env.rank);
  const int size = static_cast<int>(env.world_size);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(group_store, rank, size);

  if (backend == Backend::kGloo) {
    auto gloo =
        create_gloo(env, c10::make_intrusive<c10d::PrefixStore>("cpu/", group_store), timeout);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    // Gloo also takes CUDA tensors (through host copies), as in Python.
    group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, gloo);
  } else {
    auto nccl =
        create_nccl(env, c10::make_intrusive<c10d::PrefixStore>("cuda/", group_store), timeout);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  }
  group->setGroupName("0");
  group->setGroupDesc("default_pg");
  return group;
}

}  // namespace mantissa::distributed
