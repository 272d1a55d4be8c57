#pragma once
// Waiting for a set of collectives at once.

#include <exception>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace mantissa::detail::sharded {

/// Waits for every work in `works` and clears it, then rethrows the first failure: no work is
/// left running on buffers that are about to be freed, even when an earlier one failed.
inline void wait_all(std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  std::exception_ptr failure;
  for (auto& work : works) {
    try {
      work->wait();
    } catch (...) {
      if (failure == nullptr) failure = std::current_exception();
    }
  }
  works.clear();
  if (failure != nullptr) std::rethrow_exception(failure);
}

}  // namespace mantissa::detail::sharded
