#include "decode/detail/restart_roi.h"

#include <algorithm>
#include <cstring>

namespace stoker::decode::detail {

namespace {

bool is_sof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

void put_be16(uint8_t* p, int v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v & 0xFF);
}

}  // namespace

size_t find_baseline_sof(const uint8_t* data, size_t entropy_begin) {
  // Walks the marker segments before the scan (libjpeg has validated them).
  size_t pos = 2, sof = 0;
  while (pos + 4 <= entropy_begin) {
    if (data[pos] != 0xFF) return 0;
    const uint8_t m = data[pos + 1];
    if (m == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    const size_t length = (size_t{data[pos + 2]} << 8) | data[pos + 3];
    if (is_sof(m)) {
      if (m != 0xC0 && m != 0xC1) return 0;  // baseline / extended Huffman only
      sof = pos;
    }
    if (m == 0xDA) break;  // SOS: the scan header ends at entropy_begin
    pos += 2 + length;
  }
  return sof + 9 <= entropy_begin ? sof : 0;
}

void build_header_jpeg(const uint8_t* data, size_t entropy_begin, size_t sof_offset, int width,
                       int height, std::vector<uint8_t>& out) {
  out.resize(entropy_begin + 2);
  std::memcpy(out.data(), data, entropy_begin);
  put_be16(out.data() + sof_offset + 5, height);
  put_be16(out.data() + sof_offset + 7, width);
  out[entropy_begin] = 0xFF;
  out[entropy_begin + 1] = 0xD9;
}

bool parse_restart_layout(const uint8_t* data, size_t size, size_t entropy_begin, int width,
                          int height, int mcu_width, int mcu_height, int restart_interval,
                          RestartLayout& layout) {
  if (restart_interval <= 0 || mcu_width <= 0 || mcu_height <= 0 || entropy_begin > size ||
      entropy_begin < 4)
    return false;
  layout = RestartLayout{};
  layout.width = width;
  layout.height = height;
  layout.mcu_width = mcu_width;
  layout.mcu_height = mcu_height;
  layout.mcus_per_row = (width + mcu_width - 1) / mcu_width;
  layout.mcu_rows = (height + mcu_height - 1) / mcu_height;
  layout.interval = restart_interval;
  if (layout.mcus_per_row % restart_interval != 0) return false;
  layout.entropy_begin = entropy_begin;

  layout.sof_offset = find_baseline_sof(data, entropy_begin);
  if (layout.sof_offset == 0 || layout.sof_offset + 9 > entropy_begin) return false;

  // Interval boundaries: RSTn markers in the entropy-coded data.
  const size_t expected =
      static_cast<size_t>(layout.mcus_per_row) * layout.mcu_rows / restart_interval;
  // Every interval but the last ends in a 2-byte marker: a file cannot hold more than size / 2,
  // whatever its header claims.
  if (expected > size / 2 + 1) return false;
  layout.interval_begin.reserve(expected);
  layout.interval_end.reserve(expected);
  layout.interval_begin.push_back(entropy_begin);
  size_t p = entropy_begin;
  while (p < size) {
    const auto* ff = static_cast<const uint8_t*>(std::memchr(data + p, 0xFF, size - p));
    if (!ff) break;
    const size_t at = static_cast<size_t>(ff - data);
    size_t m = at + 1;
    while (m < size && data[m] == 0xFF) ++m;
    if (m >= size) break;
    const uint8_t c = data[m];
    if (c == 0x00) {  // stuffed byte
      p = m + 1;
      continue;
    }
    layout.interval_end.push_back(at);
    if (c < 0xD0 || c > 0xD7) break;  // EOI or another marker: the scan ends
    if (layout.interval_begin.size() == expected) return false;  // more intervals than MCUs
    layout.interval_begin.push_back(m + 1);
    p = m + 1;
  }
  if (layout.interval_end.size() < layout.interval_begin.size()) return false;  // truncated
  return layout.interval_begin.size() == expected;
}

void build_roi_jpeg(const uint8_t* data, const RestartLayout& layout, int mx0, int my0, int mx1,
                    int my1, std::vector<uint8_t>& out) {
  const int roi_height = std::min(layout.height, my1 * layout.mcu_height) - my0 * layout.mcu_height;
  const int roi_width = std::min(layout.width, mx1 * layout.mcu_width) - mx0 * layout.mcu_width;
  const int per_row = layout.mcus_per_row / layout.interval;
  // The size first, then one copy per row's run of intervals (contiguous in the file, markers
  // included, renumbered after), instead of growing the vector interval by interval.
  size_t total = layout.entropy_begin + 2;
  for (int my = my0; my < my1; ++my) {
    const int k0 = my * per_row + mx0 / layout.interval;
    const int k1 = my * per_row + mx1 / layout.interval;
    total += layout.interval_end[k1 - 1] - layout.interval_begin[k0] + 2;
  }
  out.resize(total);
  uint8_t* w = out.data();
  std::memcpy(w, data, layout.entropy_begin);
  put_be16(w + layout.sof_offset + 5, roi_height);
  put_be16(w + layout.sof_offset + 7, roi_width);
  w += layout.entropy_begin;
  int written = 0;
  for (int my = my0; my < my1; ++my) {
    const int k0 = my * per_row + mx0 / layout.interval;
    const int k1 = my * per_row + mx1 / layout.interval;
    if (written > 0) {  // the marker between the last row's run and this one
      *w++ = 0xFF;
      *w++ = static_cast<uint8_t>(0xD0 + ((written - 1) & 7));
    }
    const size_t run = layout.interval_end[k1 - 1] - layout.interval_begin[k0];
    std::memcpy(w, data + layout.interval_begin[k0], run);
    // The markers inside the run keep their place but take the ROI's numbers.
    for (int k = k0 + 1; k < k1; ++k) {
      uint8_t* marker = w + (layout.interval_begin[k] - layout.interval_begin[k0]) - 1;
      *marker = static_cast<uint8_t>(0xD0 + ((written + (k - k0) - 1) & 7));
    }
    w += run;
    written += k1 - k0;
  }
  *w++ = 0xFF;
  *w++ = 0xD9;
  out.resize(static_cast<size_t>(w - out.data()));
}

}  // namespace stoker::decode::detail
