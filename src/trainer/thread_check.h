#pragma once
// Whether a CPU run starts more OpenMP threads than the machine has cores for it: LibTorch's
// threads spin while they wait, so oversubscribed processes slow each other down several times
// (docs/trainer.md, "Threads on the CPU"). A pure policy, tested without training
// (tests/thread_check_test.cpp).

#include <cstdint>
#include <optional>
#include <string>

namespace mantissa::detail {

/// The warning for `processes_on_this_machine` processes of `threads_per_process` intra-op
/// threads each, on a machine where this process may run on `usable_cores` cores; nullopt
/// when the threads fit. Python has no such check; torchrun sets OMP_NUM_THREADS=1 for its
/// workers when it is unset, which is the usual cure.
std::optional<std::string> thread_oversubscription(std::int64_t threads_per_process,
                                                   std::int64_t processes_on_this_machine,
                                                   std::int64_t usable_cores);

/// The cores this process may run on (sched_getaffinity), at least 1.
std::int64_t usable_cores();

}  // namespace mantissa::detail
