#pragma once
// Starting the ranks of a test job as real processes on 127.0.0.1, the way torchrun starts
// them: the same environment variables, a free port, and a deadline after which a rank still
// running counts as hung and is killed. Shared by the multi-process test programs.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace mantissa::testing {

namespace detail {

// Whether `port` on 127.0.0.1 can be bound now (it is released again at once).
inline bool can_bind(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// The lower end of the kernel's ephemeral port range (32768 when it cannot be read).
inline int ephemeral_low() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  return (range >> low >> high) ? low : 32768;
}

}  // namespace detail

/// A TCP port nobody listens on right now on 127.0.0.1: a random one below the kernel's
/// ephemeral range that binds, else (a range that leaves no room) whichever one the kernel
/// gives for port 0.
inline uint16_t free_port() {
  // Below the ephemeral range: a port the kernel hands out for outgoing connections (the
  // Gloo connections of a job running beside this one) cannot take it between the check here
  // and the listen of the process that uses it.
  const int low = detail::ephemeral_low();
  if (low > 11000) {
    static std::mt19937 random(std::random_device{}());
    std::uniform_int_distribution<int> pick(10000, low - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const auto port = static_cast<uint16_t>(pick(random));
      if (detail::can_bind(port)) return port;
    }
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot find a free port: " + why);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// This process's environment without the variables a launcher sets (so a test started under
/// torchrun does not pass its own rank on).
inline std::vector<std::string> environment_without_launcher_variables() {
  const std::vector<std::string> ours = {"RANK=",
                                         "WORLD_SIZE=",
                                         "LOCAL_RANK=",
                                         "LOCAL_WORLD_SIZE=",
                                         "MASTER_ADDR=",
                                         "MASTER_PORT=",
                                         "TORCHELASTIC_USE_AGENT_STORE=",
                                         "TORCHELASTIC_RESTART_COUNT=",
                                         "GLOO_SOCKET_IFNAME=",
                                         "OMP_NUM_THREADS="};
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool replaced = false;
    for (const auto& prefix : ours) replaced |= entry.rfind(prefix, 0) == 0;
    if (!replaced) base.push_back(entry);
  }
  return base;
}

/// The variables torchrun gives rank `rank` of `world_size` on one node, talking through
/// 127.0.0.1:`port`, one thread each.
inline std::vector<std::string> rank_variables(int rank, int world_size, uint16_t port) {
  return {"RANK=" + std::to_string(rank),
          "WORLD_SIZE=" + std::to_string(world_size),
          "LOCAL_RANK=" + std::to_string(rank),
          "LOCAL_WORLD_SIZE=" + std::to_string(world_size),
          "MASTER_ADDR=127.0.0.1",
          "MASTER_PORT=" + std::to_string(port),
          "GLOO_SOCKET_IFNAME=lo",
          "OMP_NUM_THREADS=1"};
}

/// Starts `program` with `args` and the environment `env` (entries "NAME=value"); returns its
/// pid. With `output` its stdout and stderr go to that file (created or truncated). Throws when
/// it cannot start.
inline pid_t start_process(const std::string& program, std::vector<std::string> args,
                           std::vector<std::string> env, const std::string& output = "") {
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!output.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + program + ": " + std::strerror(rc));
  return pid;
}

/// Waits for `pids` until `deadline_s` seconds have passed; returns each one's exit status
/// (128 + signal when killed by one). Those still running at the deadline are killed and get
/// -1. `poll`, when given, runs every 20 ms with the statuses so far (-2 while running).
inline std::vector<int> wait_for(const std::vector<pid_t>& pids, int deadline_s,
                                 const std::function<void(const std::vector<int>&)>& poll = {}) {
  std::vector<int> status(pids.size(), -2);
  std::size_t running = pids.size();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
  while (running > 0 && std::chrono::steady_clock::now() < deadline) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -2) continue;
      int wstatus = 0;
      if (::waitpid(pids[i], &wstatus, WNOHANG) == pids[i]) {
        status[i] = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        --running;
      }
    }
    if (poll) poll(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (status[i] != -2) continue;
    std::cerr << "launcher: process " << i << " still running after " << deadline_s
              << " s: killed (a hang)" << std::endl;
    ::kill(pids[i], SIGKILL);
    ::waitpid(pids[i], nullptr, 0);
    status[i] = -1;
  }
  return status;
}

}  // namespace mantissa::testing
