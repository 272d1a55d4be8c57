#include "trainer/thread_check.h"

#include <sched.h>

#include <algorithm>

#include <fmt/format.h>

namespace mantissa::detail {

std::optional<std::string> thread_oversubscription(std::int64_t threads_per_process,
                                                   std::int64_t processes_on_this_machine,
                                                   std::int64_t usable_cores) {
  const auto wanted = threads_per_process * processes_on_this_machine;
  if (usable_cores <= 0 || wanted <= usable_cores) return std::nullopt;
  const auto fitting = std::max<std::int64_t>(1, usable_cores / processes_on_this_machine);
  return fmt::format(
      "{} process(es) on this machine with {} OpenMP thread(s) each want {} cores, and this "
      "process may use {}: the threads spin while they wait and slow each other down, often "
      "several times. Set OMP_NUM_THREADS={} (cores / processes) for each process (torchrun "
      "does so when it is unset); docs/trainer.md, \"Threads on the CPU\", says more",
      processes_on_this_machine, threads_per_process, wanted, usable_cores, fitting);
}

std::int64_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max<std::int64_t>(1, CPU_COUNT(&set));
}

}  // namespace mantissa::detail
