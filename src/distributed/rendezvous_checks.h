#pragma once
// Checks init_process_group makes around the store, so that a job started wrongly fails with a
// sentence that names the mistake instead of c10d's connect retries and timeouts.

#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "mantissa/distributed.h"

namespace mantissa::distributed::detail {

/// Throws a c10::ValueError "cannot resolve MASTER_ADDR '<name>'" with the resolver's reason
/// unless `env.master_addr` is an address or a name this host resolves (getaddrinfo, as
/// c10d's socket code does). Python's init_process_group lets c10d retry until its timeout.
void check_master_addr_resolves(const DistributedEnvironment& env);

/// Every rank publishes the WORLD_SIZE it was told under its rank in `store`; rank 0 reads
/// every other rank's, the others read rank 0's. Throws a c10::ValueError naming both ranks
/// and both sizes when they differ ("WORLD_SIZE differs between ranks: rank 0 was told 2,
/// rank 1 was told 3"), and a c10::Error naming the missing rank when one does not publish
/// within the store's timeout. Before it throws, rank 0 (the store's host) waits up to 10 s
/// for the ranks it has read to read its size, so they fail with the same sentence instead of
/// a lost connection. No Python equivalent (there, c10d times out).
void agree_on_world_size(c10d::Store& store, const DistributedEnvironment& env,
                         std::chrono::milliseconds timeout);

/// Raises c10's log level to FATAL while it lives, restoring the previous one: c10d logs a
/// warning or an error, each with a full C++ backtrace, at every failed connect attempt, and the
/// exception that ends the attempts says everything they would.
class QuietC10dWarnings {
 public:
  QuietC10dWarnings();
  ~QuietC10dWarnings();
  QuietC10dWarnings(const QuietC10dWarnings&) = delete;
  QuietC10dWarnings& operator=(const QuietC10dWarnings&) = delete;

 private:
  int previous_;
};

}  // namespace mantissa::distributed::detail
