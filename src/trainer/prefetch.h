#pragma once
// Loading the next batches on background threads while the current one trains
// (`dataloader_num_workers`), like torch.utils.data.DataLoader's worker processes.

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <vector>

#include <mantissa/batch.h>

namespace mantissa::detail {

/// Hands out batches 0..end-1 of one epoch in order. With `workers` > 0, up to `workers`
/// upcoming batches are gathered concurrently on background threads (so the dataset's
/// `get_batch` must tolerate concurrent calls, as LibTorch's DataLoader also requires);
/// with 0, each batch is gathered on the calling thread when asked for.
class BatchPrefetcher {
 public:
  using IndicesOf = std::function<std::vector<std::size_t>(std::int64_t batch)>;

  BatchPrefetcher(const BatchSource& source, IndicesOf indices_of, std::int64_t end,
                  std::int64_t workers)
      : source_(source), indices_of_(std::move(indices_of)), end_(end), workers_(workers) {}

  /// Batch `b`, with the next ones queued. An exception from `get_batch` surfaces here.
  Batch get(std::int64_t b) {
    if (workers_ == 0) return source_.get_batch(indices_of_(b));
    // Batch b and up to `workers_` after it, but not past the epoch (`end_ - b` cannot overflow;
    // `b + 1 + workers_` can).
    const std::int64_t last = workers_ < end_ - b ? b + workers_ : end_ - 1;
    for (std::int64_t k = b; k <= last; ++k) {
      if (pending_.count(k) == 0) {
        pending_.emplace(k, std::async(std::launch::async,
                                       [this, k] { return source_.get_batch(indices_of_(k)); }));
      }
    }
    auto it = pending_.find(b);
    auto batch = it->second.get();
    pending_.erase(it);
    return batch;
  }

 private:
  const BatchSource& source_;
  IndicesOf indices_of_;
  std::int64_t end_;
  std::int64_t workers_;
  std::map<std::int64_t, std::future<Batch>> pending_;
};

}  // namespace mantissa::detail
