// Fuzz target, differential: the pack-time restart-marker transcoder (add_restart_markers) and the
// decoder's region paths (restart-interval cutting, libjpeg crop and skip) against a plain decode
// of the whole image. Both claim exactness (docs/ARCHITECTURE.md), so this target checks pixels,
// not just the absence of crashes:
//   - a transcoded file decodes to the same pixels as the original;
//   - a region decoded with or without restart-interval cutting covers the rectangle asked for,
//     and its pixels equal the whole-image decode at the same scale, except within kMargin pixels
//     of a rectangle edge inside the image (the margin the loader always adds, kCropMargin);
//   - stoker's Huffman decoder for scans with restart markers (restart_huffman.h) and libjpeg's
//     give the same result for the whole image and for the region, damaged files included: the
//     same pixels and warnings, or the same error;
//   - a file without them, decoded once down to the rectangle's top recording its ScanIndex
//     (scan_index.h), then the rectangle through it (recorded further first): the first gives
//     libjpeg's result exactly, the second libjpeg's error and warnings, and its pixels inside
//     the rectangle (away from its edges) when there are none.
// Pixels are compared only for files that decode without a libjpeg warning: a corrupt file may
// legitimately decode differently when less of it is read.
//
// Input: kParamBytes of options, then a JPEG:
//   [0] low 3 bits: restart interval - 1 for the transcoder; bit 7: use the file as it is
//   [1] bits 0-1: log2 of the DCT scale denominator; bit 2: fast upsampling
//   [2..5] the rectangle, as fractions /256 of the scaled image: x0, y0, then width, height of
//   what is left
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"

using namespace stoker;

namespace {

constexpr size_t kParamBytes = 6;
constexpr int64_t kMaxPixels = int64_t{1} << 22;
constexpr int kMargin = 2;

decode::DecodeOptions options(bool restart_roi, bool fast_upsampling, bool restart_huffman = true) {
  decode::DecodeOptions o;
  o.restart_huffman = restart_huffman;
  o.max_pixels = kMaxPixels;
  o.restart_roi = restart_roi;
  o.progressive_shortcut = false;  // the shortcut is approximate by design
  o.fast_upsampling = fast_upsampling;
  return o;
}

// The whole image at 1/denom, copied out of the decoder; empty when the file does not decode
// cleanly (an error or a libjpeg warning).
struct Image {
  std::vector<uint8_t> pixels;  // rows of width * 3 bytes
  int width = 0, height = 0;
};

Image decode_whole(const uint8_t* data, size_t size, int denom, bool fast_upsampling) {
  Image image;
  decode::ImageDecoder decoder(options(false, fast_upsampling));
  try {
    const decode::ImageInfo& info = decoder.open(data, size);
    if (info.format != ImageFormat::kJpeg) return image;
    const int w = decode::scaled_size(info.width, denom),
              h = decode::scaled_size(info.height, denom);
    const decode::DecodedRegion& r = decoder.decode(denom, 0, 0, w, h);
    if (decoder.warnings() > 0) return image;
    FUZZ_CHECK(r.origin_x == 0 && r.origin_y == 0 && r.width == w && r.height == h);
    FUZZ_CHECK(r.scaled_width == w && r.scaled_height == h);
    image.width = w;
    image.height = h;
    image.pixels.resize(static_cast<size_t>(w) * h * 3);
    for (int y = 0; y < h; ++y)
      std::copy(r.pixels + y * r.stride, r.pixels + y * r.stride + w * 3,
                image.pixels.begin() + static_cast<ptrdiff_t>(y) * w * 3);
  } catch (const Error&) {
  }
  return image;
}

// What a decode gives: its error, or its warnings and pixels.
struct Outcome {
  std::string error;
  int warnings = 0;
  std::string first_warning;
  std::vector<uint8_t> pixels;
  int origin_x = 0, origin_y = 0, width = 0, height = 0;
  int scaled_width = 0, scaled_height = 0;
  bool operator==(const Outcome&) const = default;
};

Outcome decode_on(decode::ImageDecoder& decoder, const uint8_t* data, size_t size, int denom,
                  int x0, int y0, int x1, int y1, int64_t key = -1) {
  Outcome out;
  try {
    decoder.open(data, size, key);
    const decode::DecodedRegion& r = decoder.decode(denom, x0, y0, x1, y1);
    out.origin_x = r.origin_x;
    out.origin_y = r.origin_y;
    out.width = r.width;
    out.height = r.height;
    out.scaled_width = r.scaled_width;
    out.scaled_height = r.scaled_height;
    for (int y = 0; y < r.height; ++y)
      out.pixels.insert(out.pixels.end(), r.pixels + y * r.stride,
                        r.pixels + y * r.stride + r.width * 3);
  } catch (const Error& e) {
    out.error = e.what();
  }
  out.warnings = decoder.warnings();
  out.first_warning = decoder.first_warning();
  return out;
}

Outcome decode_with(const uint8_t* data, size_t size, int denom, int x0, int y0, int x1, int y1,
                    bool restart_roi, bool fast_upsampling, bool restart_huffman) {
  decode::ImageDecoder decoder(options(restart_roi, fast_upsampling, restart_huffman));
  return decode_on(decoder, data, size, denom, x0, y0, x1, y1);
}

// The ScanIndex path against libjpeg's: the image down to the rectangle's top records, then the
// rectangle is cut through the index, which records the rows below first.
void check_scan_index(const uint8_t* data, size_t size, int denom, int x0, int y0, int x1, int y1,
                      bool fast_upsampling) {
  auto cache = std::make_shared<decode::ScanIndexCache>(int64_t{1} << 30);
  decode::ImageDecoder ours(options(true, fast_upsampling), cache);
  const int w = 1 << 14;
  const Outcome first = decode_on(ours, data, size, denom, 0, 0, w, y0 + 1, 1);
  const Outcome theirs =
      decode_with(data, size, denom, 0, 0, w, y0 + 1, true, fast_upsampling, false);
  if (!(first == theirs)) {
    std::fprintf(stderr,
                 "scan index, recording: '%s' %d warnings vs libjpeg's '%s' %d, pixels %s\n",
                 first.error.c_str(), first.warnings, theirs.error.c_str(), theirs.warnings,
                 first.pixels == theirs.pixels ? "equal" : "differ");
    FUZZ_CHECK(first == theirs);
  }
  const Outcome cut = decode_on(ours, data, size, denom, x0, y0, x1, y1, 1);
  const Outcome plain =
      decode_with(data, size, denom, x0, y0, x1, y1, true, fast_upsampling, false);
  if (cut.error != plain.error || cut.warnings != plain.warnings ||
      cut.first_warning != plain.first_warning) {
    std::fprintf(stderr, "scan index, cut: '%s' %d warnings vs libjpeg's '%s' %d\n",
                 cut.error.c_str(), cut.warnings, plain.error.c_str(), plain.warnings);
    FUZZ_CHECK(cut.error == plain.error && cut.warnings == plain.warnings &&
               cut.first_warning == plain.first_warning);
  }
  if (!plain.error.empty() || plain.warnings > 0 || !theirs.error.empty()) return;
  // The scaled image's size, and the rectangle as the decoder clipped it.
  const int sw = plain.scaled_width, sh = plain.scaled_height;
  x1 = std::min(x1, sw);
  y1 = std::min(y1, sh);
  FUZZ_CHECK(cut.origin_x <= x0 && cut.origin_y <= y0);
  FUZZ_CHECK(cut.origin_x + cut.width >= x1 && cut.origin_y + cut.height >= y1);
  // Away from the cut's own edges (inside the image): fancy upsampling sees them as the image's.
  const int cx0 = std::max(x0, cut.origin_x > 0 ? cut.origin_x + kMargin : 0);
  const int cy0 = std::max(y0, cut.origin_y > 0 ? cut.origin_y + kMargin : 0);
  const int right = cut.origin_x + cut.width, bottom = cut.origin_y + cut.height;
  const int cx1 = std::min(x1, right < sw ? right - kMargin : right);
  const int cy1 = std::min(y1, bottom < sh ? bottom - kMargin : bottom);
  for (int y = cy0; y < cy1; ++y)
    for (int x = cx0; x < cx1; ++x)
      for (int c = 0; c < 3; ++c) {
        const uint8_t got =
            cut.pixels[(static_cast<size_t>(y - cut.origin_y) * cut.width + (x - cut.origin_x)) *
                           3 +
                       c];
        const uint8_t want = plain.pixels[(static_cast<size_t>(y - plain.origin_y) * plain.width +
                                           (x - plain.origin_x)) *
                                              3 +
                                          c];
        if (got != want) {
          std::fprintf(
              stderr,
              "scan index, cut (%d,%d)-(%d,%d) at 1/%d: pixel (%d,%d)[%d] is %d, libjpeg's %d\n",
              x0, y0, x1, y1, denom, x, y, c, got, want);
          FUZZ_CHECK(got == want);
        }
      }
}

// stoker's restart-interval Huffman decoder against libjpeg's: the same outcome, always.
void check_huffman(const uint8_t* data, size_t size, int denom, int x0, int y0, int x1, int y1,
                   bool restart_roi, bool fast_upsampling) {
  const Outcome ours =
      decode_with(data, size, denom, x0, y0, x1, y1, restart_roi, fast_upsampling, true);
  const Outcome theirs =
      decode_with(data, size, denom, x0, y0, x1, y1, restart_roi, fast_upsampling, false);
  if (!(ours == theirs)) {
    std::fprintf(stderr,
                 "restart_huffman: '%s' %d warnings ('%s') vs libjpeg's '%s' %d warnings ('%s'), "
                 "pixels %s\n",
                 ours.error.c_str(), ours.warnings, ours.first_warning.c_str(),
                 theirs.error.c_str(), theirs.warnings, theirs.first_warning.c_str(),
                 ours.pixels == theirs.pixels ? "equal" : "differ");
    FUZZ_CHECK(ours == theirs);
  }
}

void check_region(const uint8_t* data, size_t size, const Image& whole, int denom, int x0, int y0,
                  int x1, int y1, bool restart_roi, bool fast_upsampling) {
  decode::ImageDecoder decoder(options(restart_roi, fast_upsampling));
  decoder.open(data, size);  // it opened before: no error now
  const decode::DecodedRegion& r = decoder.decode(denom, x0, y0, x1, y1);
  FUZZ_CHECK(decoder.warnings() == 0);
  FUZZ_CHECK(r.scaled_width == whole.width && r.scaled_height == whole.height);
  FUZZ_CHECK(r.origin_x <= x0 && r.origin_y <= y0);
  FUZZ_CHECK(r.origin_x + r.width >= x1 && r.origin_y + r.height >= y1);
  FUZZ_CHECK(r.origin_x + r.width <= whole.width && r.origin_y + r.height <= whole.height);
  const int cx0 = x0 > 0 ? x0 + kMargin : 0, cy0 = y0 > 0 ? y0 + kMargin : 0;
  const int cx1 = x1 < whole.width ? x1 - kMargin : x1;
  const int cy1 = y1 < whole.height ? y1 - kMargin : y1;
  for (int y = cy0; y < cy1; ++y)
    for (int x = cx0; x < cx1; ++x)
      for (int c = 0; c < 3; ++c) {
        const uint8_t got = r.pixels[(y - r.origin_y) * r.stride + (x - r.origin_x) * 3 + c];
        const uint8_t want = whole.pixels[(static_cast<size_t>(y) * whole.width + x) * 3 + c];
        if (got != want) {
          std::fprintf(stderr,
                       "region (%d,%d)-(%d,%d) at 1/%d, restart_roi=%d: pixel (%d,%d)[%d] is %d, "
                       "the whole-image decode has %d\n",
                       x0, y0, x1, y1, denom, restart_roi, x, y, c, got, want);
          FUZZ_CHECK(got == want);
        }
      }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kParamBytes) return 0;
  const uint8_t* p = data;
  data += kParamBytes;
  size -= kParamBytes;
  const int interval = 1 + (p[0] & 7);
  const bool as_is = p[0] & 0x80;
  const int denom = 1 << (p[1] & 3);
  const bool fast_upsampling = p[1] & 4;

  // What stoker.pack stores: the file rewritten with restart markers when it applies.
  std::vector<uint8_t> marked;
  bool transcoded = false;
  if (!as_is && sniff_image_format(data, size) == ImageFormat::kJpeg) {
    try {
      // Pack runs the transcoder only on files that decoded within the limits.
      decode::ImageDecoder probe(options(false, false));
      probe.open(data, size);
      transcoded = decode::add_restart_markers(data, size, interval, marked);
    } catch (const Error&) {
    }
  }
  const uint8_t* file = transcoded ? marked.data() : data;
  const size_t file_size = transcoded ? marked.size() : size;

  {
    // Damaged files too: the rectangle as fractions of a size the header may not even give.
    const int w = 1 << 14;
    const int rx0 = p[2] * w / 256, ry0 = p[3] * w / 256;
    const int rx1 = rx0 + 1 + p[4] * (w - rx0 - 1) / 255,
              ry1 = ry0 + 1 + p[5] * (w - ry0 - 1) / 255;
    check_huffman(file, file_size, denom, 0, 0, w, w, false, fast_upsampling);
    check_huffman(file, file_size, denom, rx0 / 16, ry0 / 16, rx1 / 16, ry1 / 16, true,
                  fast_upsampling);
    check_scan_index(file, file_size, denom, rx0 / 16, ry0 / 16, rx1 / 16, ry1 / 16,
                     fast_upsampling);
  }
  const Image whole = decode_whole(file, file_size, denom, fast_upsampling);
  if (whole.pixels.empty()) return 0;
  if (transcoded) {
    const Image original = decode_whole(data, size, denom, fast_upsampling);
    if (!original.pixels.empty()) {
      FUZZ_CHECK(original.width == whole.width && original.height == whole.height);
      FUZZ_CHECK(original.pixels == whole.pixels);  // lossless
    }
  }

  const int x0 = p[2] * whole.width / 256, y0 = p[3] * whole.height / 256;
  const int x1 = x0 + 1 + p[4] * (whole.width - x0 - 1) / 255;
  const int y1 = y0 + 1 + p[5] * (whole.height - y0 - 1) / 255;
  check_region(file, file_size, whole, denom, x0, y0, x1, y1, true, fast_upsampling);
  check_region(file, file_size, whole, denom, x0, y0, x1, y1, false, fast_upsampling);
  return 0;
}
