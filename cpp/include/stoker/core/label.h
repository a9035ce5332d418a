// A class label as WebDataset stores it (KEY.cls): ASCII decimal, surrounding whitespace allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "stoker/core/error.h"

namespace stoker {

inline constexpr size_t kMaxLabelBytes = 64;

// The label, or nullopt for an empty (all-whitespace) member. Throws Error(kCorruptData) for
// anything but a non-negative decimal integer that fits in int64, or more than kMaxLabelBytes.
inline std::optional<int64_t> parse_label(const uint8_t* text, size_t size) {
  STOKER_CHECK(size <= kMaxLabelBytes, ErrorCode::kCorruptData,
               "label is over " + std::to_string(kMaxLabelBytes) + " bytes");
  auto space = [](uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  size_t i = 0;
  while (i < size && space(text[i])) ++i;
  if (i == size) return std::nullopt;
  int64_t label = 0;
  size_t digits = 0;
  for (; i < size && text[i] >= '0' && text[i] <= '9'; ++i, ++digits) {
    STOKER_CHECK(label <= (INT64_MAX - 9) / 10, ErrorCode::kCorruptData, "label is too large");
    label = label * 10 + (text[i] - '0');
  }
  while (i < size && space(text[i])) ++i;
  STOKER_CHECK(digits > 0 && i == size, ErrorCode::kCorruptData,
               "label is not a non-negative integer");
  return label;
}

}  // namespace stoker
