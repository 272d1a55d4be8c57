#include "distributed/rendezvous_checks.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

namespace mantissa::distributed::detail {
namespace {

constexpr const char* kWorldSizeKey = "mantissa/world_size/rank_";
constexpr const char* kReadKey = "mantissa/world_size/read_by_rank_";

std::string world_size_key(int64_t rank) { return kWorldSizeKey + std::to_string(rank); }

// Set by a rank once it holds rank 0's WORLD_SIZE: rank 0 hosts the store, and leaving before
// a rank has read its value would turn that rank's clear error into a lost connection.
std::string read_key(int64_t rank) { return kReadKey + std::to_string(rank); }

std::string as_text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// The WORLD_SIZE rank `rank` published, waiting for it at most the store's timeout.
std::string world_size_of(c10d::Store& store, int64_t rank, const DistributedEnvironment& env,
                          std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  try {
    store.wait({world_size_key(rank)}, timeout);
  } catch (const std::exception&) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    TORCH_CHECK(waited < timeout, "rank ", env.rank, " of ", env.world_size, ": rank ", rank,
                " did not join the job's store within ", timeout.count(),
                " ms (did it start, with the same MASTER_ADDR and MASTER_PORT?)");
    TORCH_CHECK(false, "rank ", env.rank, " of ", env.world_size,
                ": lost the connection to the job's store after ", waited.count(),
                " ms, while waiting for rank ", rank,
                " (rank 0 hosts the store: did it stop? its error says why)");
  }
  return as_text(store.get(world_size_key(rank)));
}

// Waits, at most `timeout`, until ranks 1..last have read rank 0's WORLD_SIZE; a rank that
// never does is left to its own timeout error.
void wait_until_read(c10d::Store& store, int64_t last, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int64_t rank = 1; rank <= last; ++rank) keys.push_back(read_key(rank));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
  }
}

}  // namespace

void check_master_addr_resolves(const DistributedEnvironment& env) {
  if (env.master_addr.empty()) return;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  TORCH_CHECK_VALUE(rc == 0, "rank ", env.rank, " of ", env.world_size,
                    ": cannot resolve MASTER_ADDR '", env.master_addr, "' (", ::gai_strerror(rc),
                    "); set it to rank 0's host name or IP address");
}

void agree_on_world_size(c10d::Store& store, const DistributedEnvironment& env,
                         std::chrono::milliseconds timeout) {
  const std::string mine = std::to_string(env.world_size);
  store.set(world_size_key(env.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  const auto differs = [&](int64_t other, const std::string& theirs) {
    const int64_t low = std::min(env.rank, other);
    const int64_t high = std::max(env.rank, other);
    const std::string& told_low = low == env.rank ? mine : theirs;
    const std::string& told_high = low == env.rank ? theirs : mine;
    TORCH_CHECK_VALUE(false, "WORLD_SIZE differs between ranks: rank ", low, " was told ", told_low,
                      ", rank ", high, " was told ", told_high,
                      "; start every process with the same WORLD_SIZE");
  };
  if (env.rank != 0) {
    const auto rank0 = world_size_of(store, 0, env, timeout);
    store.set(read_key(env.rank), std::vector<uint8_t>{1});
    if (rank0 != mine) differs(0, rank0);
    return;
  }
  for (int64_t rank = 1; rank < env.world_size; ++rank) {
    const auto theirs = world_size_of(store, rank, env, timeout);
    if (theirs != mine) {
      wait_until_read(store, rank, std::min(timeout, std::chrono::milliseconds(10000)));
      differs(rank, theirs);
    }
  }
}

QuietC10dWarnings::QuietC10dWarnings() : previous_(FLAGS_caffe2_log_level) {
  // c10d logs its failed connects at ERROR (with the exception's backtrace); FATAL still shows.
  if (FLAGS_caffe2_log_level < c10::GLOG_FATAL) FLAGS_caffe2_log_level = c10::GLOG_FATAL;
}

QuietC10dWarnings::~QuietC10dWarnings() { FLAGS_caffe2_log_level = previous_; }

}  // namespace mantissa::distributed::detail
