#pragma once

#include <chrono>
#include <cstdint>

namespace stoker {

// Monotonic time in nanoseconds, for the per-stage timings.
inline int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace stoker
