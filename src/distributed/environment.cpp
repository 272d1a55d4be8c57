// DistributedEnvironment: the launcher's variables, parsed and checked once.

#include <cerrno>
#include <cstdlib>
#include <limits>

#include <c10/util/Exception.h>

#include "mantissa/distributed.h"

namespace mantissa::distributed {
namespace {

// The whole value must be a base-10 integer: "2 ", "0x1" or "" are mistakes worth reporting.
int64_t parse_integer(const std::string& name, const std::string& value) {
  const char* begin = value.c_str();
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(begin, &end, 10);
  TORCH_CHECK_VALUE(!value.empty() && end == begin + value.size() && errno == 0,
                    "environment variable ", name, " must be an integer, but it is '", value, "'");
  return static_cast<int64_t>(parsed);
}

}  // namespace

DistributedEnvironment DistributedEnvironment::from_lookup(const EnvLookup& lookup) {
  const auto get = [&](const char* name) { return lookup(name); };
  DistributedEnvironment env;
  if (const auto v = get("GLOO_SOCKET_IFNAME")) env.gloo_socket_ifname = *v;
  const auto rank = get("RANK");
  const auto world_size = get("WORLD_SIZE");
  if (!rank && !world_size) return env;  // a lone process
  TORCH_CHECK_VALUE(world_size, "environment variable RANK is set (", *rank,
                    ") but WORLD_SIZE is not; a launcher sets both (torchrun does)");
  TORCH_CHECK_VALUE(rank, "environment variable WORLD_SIZE is set (", *world_size,
                    ") but RANK is not; a launcher sets both (torchrun does)");

  env.world_size = parse_integer("WORLD_SIZE", *world_size);
  TORCH_CHECK_VALUE(env.world_size >= 1 && env.world_size <= std::numeric_limits<int>::max(),
                    "environment variable WORLD_SIZE must be at least 1, but it is ",
                    env.world_size);
  env.rank = parse_integer("RANK", *rank);
  TORCH_CHECK_VALUE(env.rank >= 0 && env.rank < env.world_size, "environment variable RANK (",
                    env.rank, ") must be in [0, WORLD_SIZE - 1] = [0, ", env.world_size - 1, "]");

  // A one-node launch may leave the local variables out: there, local means global.
  env.local_world_size = env.world_size;
  if (const auto v = get("LOCAL_WORLD_SIZE")) {
    env.local_world_size = parse_integer("LOCAL_WORLD_SIZE", *v);
    TORCH_CHECK_VALUE(env.local_world_size >= 1 && env.local_world_size <= env.world_size,
                      "environment variable LOCAL_WORLD_SIZE (", env.local_world_size,
                      ") must be in [1, WORLD_SIZE] = [1, ", env.world_size, "]");
  }
  env.local_rank = env.rank;
  if (const auto v = get("LOCAL_RANK")) {
    env.local_rank = parse_integer("LOCAL_RANK", *v);
  }
  TORCH_CHECK_VALUE(env.local_rank >= 0 && env.local_rank < env.local_world_size,
                    "environment variable LOCAL_RANK (", env.local_rank,
                    ") must be in [0, LOCAL_WORLD_SIZE - 1] = [0, ", env.local_world_size - 1, "]");

  if (const auto v = get("MASTER_ADDR")) env.master_addr = *v;
  if (const auto v = get("MASTER_PORT")) {
    const int64_t port = parse_integer("MASTER_PORT", *v);
    TORCH_CHECK_VALUE(port >= 1 && port <= 65535,
                      "environment variable MASTER_PORT must be a port in [1, 65535], but it is ",
                      port);
    env.master_port = static_cast<uint16_t>(port);
  }
  if (env.world_size > 1) {
    TORCH_CHECK_VALUE(!env.master_addr.empty(), "environment variable MASTER_ADDR is not set; ",
                      "with WORLD_SIZE=", env.world_size,
                      " every rank needs the address of rank 0's store");
    TORCH_CHECK_VALUE(env.master_port != 0, "environment variable MASTER_PORT is not set; ",
                      "with WORLD_SIZE=", env.world_size,
                      " every rank needs the port of rank 0's store");
  }

  // Python compares with str(True): only the exact text "True" counts.
  env.use_agent_store = get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (const auto v = get("TORCHELASTIC_RESTART_COUNT")) {
    env.restart_count = parse_integer("TORCHELASTIC_RESTART_COUNT", *v);
    TORCH_CHECK_VALUE(env.restart_count >= 0,
                      "environment variable TORCHELASTIC_RESTART_COUNT must not be negative, ",
                      "but it is ", env.restart_count);
  }
  return env;
}

DistributedEnvironment DistributedEnvironment::from_env() {
  return from_lookup([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown Backend ", static_cast<int>(backend));
}

}  // namespace mantissa::distributed
