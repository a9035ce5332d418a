// Region-of-interest decoding through restart markers. A baseline JPEG whose single scan has
// restart markers at MCU-row-aligned intervals can be cut into a smaller, valid JPEG holding only
// the intervals a crop covers: the entropy decoder then never sees the rest of the image (with
// libjpeg alone, every row down to the crop's bottom must be Huffman-decoded).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker::decode::detail {

struct RestartLayout {
  int width = 0, height = 0;
  int mcu_width = 0, mcu_height = 0;  // pixels at full scale
  int mcus_per_row = 0, mcu_rows = 0;
  int interval = 0;       // MCUs per restart interval; divides mcus_per_row
  size_t sof_offset = 0;  // of the SOF marker (FF Cx)
  size_t entropy_begin = 0;
  std::vector<size_t> interval_begin, interval_end;  // byte ranges of each interval's data
};

// Fills `layout` and returns true when the file can be cut by restart intervals: restart
// markers every `restart_interval` MCUs with the interval dividing an MCU row, and exactly the
// expected number of intervals before the end of the scan. False for anything else (the caller
// then decodes normally).
bool parse_restart_layout(const uint8_t* data, size_t size, size_t entropy_begin, int width,
                          int height, int mcu_width, int mcu_height, int restart_interval,
                          RestartLayout& layout);

// The offset of the SOF marker of a baseline or extended-Huffman file (SOF0, SOF1) among the
// marker segments before the scan; 0 for none or another process.
size_t find_baseline_sof(const uint8_t* data, size_t entropy_begin);

// The headers of the file (everything before `entropy_begin`) with the dimensions `width` x
// `height` and an end-of-image marker where the scan's data was: what libjpeg reads while a
// ScanIndex-driven decoder (restart_huffman.h) reads the data from the original file.
void build_header_jpeg(const uint8_t* data, size_t entropy_begin, size_t sof_offset, int width,
                       int height, std::vector<uint8_t>& out);

// A JPEG of MCU columns [mx0, mx1) and MCU rows [my0, my1) of the image; mx0 and mx1 must be
// multiples of layout.interval (or mx1 == mcus_per_row). Restart markers are renumbered.
void build_roi_jpeg(const uint8_t* data, const RestartLayout& layout, int mx0, int my0, int mx1,
                    int my1, std::vector<uint8_t>& out);

}  // namespace stoker::decode::detail
