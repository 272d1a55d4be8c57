#include "mantissa/memory/cpu_caching_allocator.h"

// Written by hand: LibTorch's desktop builds keep no CPU cache (c10's CPUCachingAllocator is
// compiled for mobile only), and the C library's malloc hands large freed blocks back to the
// kernel, so every training step faults its activations' pages in anew.

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

namespace mantissa::memory {
namespace {

constexpr std::size_t kLine = 64;
// Above LibTorch's default registration (0), so the cache wins over it but not over an
// allocator a program registers with a higher priority on purpose.
constexpr std::uint8_t kPriority = 1;

std::size_t quarter_of_physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return std::size_t{1} << 30;
  return static_cast<std::size_t>(pages) / 4 * static_cast<std::size_t>(page_size);
}

// Every allocation starts with a header line: its size and whether it is a cache block. The
// tensor's data pointer is the line after it and is also the DataPtr's context, as LibTorch's
// raw_allocate (used by oneDNN's scratch buffers) requires, so one deleter serves every block.
struct alignas(kLine) Header {
  std::size_t bytes;  // the whole block, header included
  bool cached;        // a block of a size class, kept for reuse when freed
};
static_assert(sizeof(Header) == kLine, "the header is one line, so the data stays aligned");

Header* header_of(void* data) { return static_cast<Header*>(data) - 1; }

class CachingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0) return {nullptr, nullptr, &CachingCpuAllocator::deleter, cpu()};
    const bool cached = n >= min_block_bytes_.load(std::memory_order_relaxed);
    TORCH_CHECK(n <= std::numeric_limits<std::size_t>::max() - 2 * kLine, "a CPU tensor of ", n,
                " bytes cannot be allocated");
    const std::size_t bytes = cached ? cpu_cache_size_class(n + kLine) : n + kLine;
    Header* header = cached ? take_cached(bytes) : nullptr;
    if (header == nullptr) {
      header = static_cast<Header*>(c10::alloc_cpu(bytes));  // throws, naming the size
      header->bytes = bytes;
      header->cached = cached;
      if (cached) count_new(bytes);
    }
    void* data = header + 1;
    if (c10::memoryProfilingEnabled()) report(data, static_cast<std::int64_t>(bytes));
    return {data, data, &CachingCpuAllocator::deleter, cpu()};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CachingCpuAllocator::deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void configure(const CpuCachingAllocatorOptions& options) {
    std::lock_guard<std::mutex> lock(mutex_);
    min_block_bytes_ = std::max<std::size_t>(options.min_block_bytes, 1);
    max_cached_bytes_ =
        options.max_cached_bytes != 0 ? options.max_cached_bytes : quarter_of_physical_memory();
    caching_ = true;
    stats_.enabled = true;
  }

  void stop_caching() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      caching_ = false;
      stats_.enabled = false;
    }
    empty();
  }

  void empty() {
    std::vector<Header*> to_free;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& entry : free_blocks_) {
        to_free.insert(to_free.end(), entry.second.begin(), entry.second.end());
      }
      free_blocks_.clear();
      stats_.cached_bytes = 0;
    }
    for (Header* header : to_free) c10::free_cpu(header);
  }

  CpuCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  /// The one instance, never destroyed.
  static CachingCpuAllocator& self();

 private:
  static c10::Device cpu() { return c10::Device(c10::DeviceType::CPU); }

  static void deleter(void* data) {
    if (data != nullptr) self().give_back(header_of(data));
  }

  static void report(void* data, std::int64_t delta) {
    const auto s = self().stats();
    c10::reportMemoryUsageToProfiler(data, delta, static_cast<std::size_t>(s.allocated_bytes),
                                     static_cast<std::size_t>(s.allocated_bytes + s.cached_bytes),
                                     cpu());
  }

  Header* take_cached(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.allocations;
    const auto it = free_blocks_.find(bytes);
    if (it == free_blocks_.end() || it->second.empty()) return nullptr;
    Header* header = it->second.back();
    it->second.pop_back();
    ++stats_.cache_hits;
    stats_.cached_bytes -= static_cast<std::int64_t>(bytes);
    stats_.allocated_bytes += static_cast<std::int64_t>(bytes);
    return header;
  }

  // Counts a cache block just taken from the system (small blocks are not the cache's).
  void count_new(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated_bytes += static_cast<std::int64_t>(bytes);
    stats_.peak_reserved_bytes =
        std::max(stats_.peak_reserved_bytes, stats_.allocated_bytes + stats_.cached_bytes);
  }

  void give_back(Header* header) {
    const auto bytes = static_cast<std::int64_t>(header->bytes);
    if (c10::memoryProfilingEnabled()) report(header + 1, -bytes);
    if (header->cached) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.allocated_bytes -= bytes;
      if (caching_ && static_cast<std::size_t>(stats_.cached_bytes + bytes) <= max_cached_bytes_) {
        free_blocks_[header->bytes].push_back(header);
        stats_.cached_bytes += bytes;
        return;
      }
    }
    c10::free_cpu(header);
  }

  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<Header*>> free_blocks_;
  std::atomic<std::size_t> min_block_bytes_{CpuCachingAllocatorOptions{}.min_block_bytes};
  std::size_t max_cached_bytes_ = 0;
  bool caching_ = false;
  CpuCacheStats stats_;
};

// Never destroyed: tensors freed during static destruction still reach their deleter.
CachingCpuAllocator& CachingCpuAllocator::self() {
  static auto* allocator = new CachingCpuAllocator();
  return *allocator;
}

std::mutex& registration_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

std::size_t cpu_cache_size_class(std::size_t bytes) {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  if (bytes <= kLine) return kLine;
  int log2 = 0;
  for (std::size_t rest = bytes; rest > 1; rest >>= 1) ++log2;
  const std::size_t step = std::max<std::size_t>(kLine, std::size_t{1} << std::max(log2 - 3, 0));
  TORCH_CHECK(bytes <= kMax - (step - 1), "a CPU tensor of ", bytes,
              " bytes cannot be allocated (its size class would not fit in size_t)");
  return (bytes + step - 1) / step * step;
}

bool enable_cpu_caching_allocator(const CpuCachingAllocatorOptions& options) {
  std::lock_guard<std::mutex> lock(registration_mutex());
  auto& cache = CachingCpuAllocator::self();
  cache.configure(options);
  c10::SetCPUAllocator(&cache, kPriority);
  if (c10::GetCPUAllocator() != &cache) {
    cache.stop_caching();
    return false;
  }
  return true;
}

void disable_cpu_caching_allocator() {
  std::lock_guard<std::mutex> lock(registration_mutex());
  auto& cache = CachingCpuAllocator::self();
  if (c10::GetCPUAllocator() == &cache) c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), kPriority);
  cache.stop_caching();
}

void empty_cpu_cache() { CachingCpuAllocator::self().empty(); }

CpuCacheStats cpu_cache_stats() { return CachingCpuAllocator::self().stats(); }

}  // namespace mantissa::memory
