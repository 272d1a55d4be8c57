#pragma once
// The median of a benchmark's repeated timings (the mean of the middle two for an even count).

#include <algorithm>
#include <vector>

namespace mantissa_bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace mantissa_bench
