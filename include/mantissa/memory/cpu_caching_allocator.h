#pragma once
// A caching allocator for LibTorch's CPU tensors: freed blocks are kept and handed out again,
// so that a training step's activations reuse the memory of the step before instead of going
// back to the C library (and the kernel) and faulting their pages in again.

#include <cstddef>
#include <cstdint>

namespace mantissa::memory {

/// How the CPU cache behaves. The defaults suit a training loop, whose every step allocates
/// the same sizes again.
struct CpuCachingAllocatorOptions {
  /// Requests below this many bytes are not cached: they come from the C library each time
  /// (`c10::alloc_cpu`, as LibTorch's own allocator does), whose free lists serve small blocks
  /// without faulting pages in.
  std::size_t min_block_bytes = std::size_t{64} << 10;
  /// The most bytes kept in free blocks; a block freed beyond it goes back to the system.
  /// 0 means a quarter of the machine's physical memory.
  std::size_t max_cached_bytes = 0;
};

/// What the cache holds now and has done since it was enabled.
struct CpuCacheStats {
  bool enabled = false;             ///< whether LibTorch's CPU allocations go through the cache
  std::int64_t allocated_bytes = 0; ///< bytes of the cache's blocks (headers included) held now
  std::int64_t cached_bytes = 0;    ///< bytes of free blocks kept for reuse
  std::int64_t peak_reserved_bytes = 0;  ///< most bytes held (allocated + cached) at once
  std::int64_t allocations = 0;     ///< requests the cache served (at least min_block_bytes)
  std::int64_t cache_hits = 0;      ///< of those, how many reused a free block
};

/// Makes the cache LibTorch's CPU allocator (`c10::SetCPUAllocator`), for every CPU tensor
/// allocated from now on, in every thread; calling it again changes the options. Returns
/// false, changing nothing, when another allocator of higher priority holds the place. A
/// tensor keeps the allocator that made it, so tensors made before still free as they did.
/// Freed blocks are reused for requests of their size class (eight classes per power of two:
/// a request gets at most 12.5% more than it asked for, in address space). Every block, small
/// or cached, starts with a 64-byte header line; `raw_allocate` works (oneDNN uses it). Python has no
/// counterpart on the CPU; on CUDA, PyTorch's caching allocator does this from the start.
/// The Trainer calls it for CPU runs (`TrainingArguments::cpu_caching_allocator`). No device.
bool enable_cpu_caching_allocator(const CpuCachingAllocatorOptions& options = {});

/// Gives LibTorch's own CPU allocator its place back and frees the cached blocks; blocks still
/// held by tensors go back to the system when those tensors are freed.
void disable_cpu_caching_allocator();

/// Frees the blocks the cache keeps but no tensor holds. Python (CUDA): `torch.cuda.empty_cache()`.
void empty_cpu_cache();

/// The cache's counters (all zero before it is first enabled).
CpuCacheStats cpu_cache_stats();

/// The bytes the cache reserves for a request of `bytes` (its size class): `bytes` rounded up
/// to a multiple of a 64-byte line, then to one of eight steps between consecutive powers of
/// two. A pure function, exposed for tests.
std::size_t cpu_cache_size_class(std::size_t bytes);

}  // namespace mantissa::memory
