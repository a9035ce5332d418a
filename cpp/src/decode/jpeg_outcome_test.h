// For the decode module's tests: what one decode gives through the private JPEG decoder (its
// error, or its warnings and pixels), and which entropy decoder ran it.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "decode/detail/decoders.h"
#include "stoker/core/error.h"

namespace stoker::decode::test_support {

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

struct JpegOutcome {
  std::string error;
  int warnings = 0;
  std::string first_warning;
  std::vector<uint8_t> pixels;  // rows of width * 3
  int origin_x = 0, origin_y = 0, width = 0, height = 0;
  bool ours = false;  // stoker's Huffman decoder installed and not handed back
  bool handed_back = false;
  detail::RestartHuffmanDecoder::Mode mode = detail::RestartHuffmanDecoder::Mode::kRestart;
  bool same_result(const JpegOutcome& o) const {
    return error == o.error && warnings == o.warnings && first_warning == o.first_warning &&
           pixels == o.pixels && origin_x == o.origin_x && origin_y == o.origin_y &&
           width == o.width && height == o.height;
  }
  uint8_t at(int x, int y, int c) const {  // pixel (x, y) of the scaled image
    return pixels[(static_cast<size_t>(y - origin_y) * width + (x - origin_x)) * 3 + c];
  }
};

// `key`: the file's in the decoder's ScanIndexCache (-1: none).
inline JpegOutcome decode_jpeg(detail::JpegDecoder& d, const std::vector<uint8_t>& file, int denom,
                               int x0, int y0, int x1, int y1, bool restart_huffman = true,
                               int64_t key = -1) {
  DecodeOptions options;
  options.restart_huffman = restart_huffman;
  JpegOutcome out;
  std::vector<uint8_t> pixels;
  DecodedRegion r;
  try {
    d.read_header(file.data(), file.size(), options);
    d.scan_key = key;
    d.decode(denom, x0, y0, x1, y1, options, pixels, r);
    out.origin_x = r.origin_x;
    out.origin_y = r.origin_y;
    out.width = r.width;
    out.height = r.height;
    for (int y = 0; y < r.height; ++y)
      out.pixels.insert(out.pixels.end(), r.pixels + y * r.stride,
                        r.pixels + y * r.stride + r.width * 3);
  } catch (const Error& e) {
    out.error = e.what();
  }
  out.warnings = d.err.warnings;
  out.first_warning = d.err.first_warning;
  out.ours = d.huffman.installed && !d.huffman.bailed;
  out.handed_back = d.huffman.bailed;
  out.mode = d.huffman.mode;
  return out;
}

}  // namespace stoker::decode::test_support
