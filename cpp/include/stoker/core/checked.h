// Overflow-checked arithmetic for sizes and offsets read from untrusted files.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "stoker/core/error.h"

namespace stoker {

inline uint64_t checked_add(uint64_t a, uint64_t b, const char* what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw_error(ErrorCode::kCorruptData, std::string(what) + ": size overflows");
  return r;
}

inline uint64_t checked_mul(uint64_t a, uint64_t b, const char* what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw_error(ErrorCode::kCorruptData, std::string(what) + ": size overflows");
  return r;
}

// True when [offset, offset + size) lies inside [0, limit).
inline bool range_within(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

}  // namespace stoker
