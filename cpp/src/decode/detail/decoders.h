// Private: the per-format halves of ImageDecoder.
#pragma once

#include <csetjmp>
#include <cstdio>  // before jpeglib.h, which uses FILE without including it
#include <string>
#include <utility>
#include <vector>

// clang-format off
#include <jpeglib.h>
#include <spng.h>
#include <webp/decode.h>
// clang-format on

#include "decode/detail/restart_huffman.h"
#include "decode/detail/restart_roi.h"
#include "stoker/decode/image_decoder.h"

namespace stoker::decode {

namespace detail {

struct JpegDecoder {
  struct ErrorManager {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    int warnings = 0;
    char first_warning[JMSG_LENGTH_MAX] = {};  // the text of the first warning, for reports
    bool scan_limit_hit = false;
    int max_scans = 0;
  };

  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  ImageInfo read_header(const uint8_t* data, size_t size, const DecodeOptions& options);
  // ImageDecoder::starts: the header read again afterwards.
  bool starts(const uint8_t* data, size_t size, const DecodeOptions& options);
  void decode(int scale_denom, int x0, int y0, int x1, int y1, const DecodeOptions& options,
              std::vector<uint8_t>& pixels, DecodedRegion& out);
  // Who entropy-decodes a try of decode(): libjpeg, or stoker's decoder (restart_huffman.h) in
  // one of its modes.
  enum class Entropy { kLibjpeg, kRestart, kRecord, kSeek };
  void decode_once(int scale_denom, int x0, int y0, int x1, int y1, const DecodeOptions& options,
                   Entropy entropy, std::vector<uint8_t>& pixels, DecodedRegion& out);
  // The scan's ScanIndex in `scan_indexes` (null when there is none or it is another file's).
  std::shared_ptr<const ScanIndex> find_scan_index() const;
  // After a try of decode() with `first` (kRecord, kSeek): what the cache keeps of it.
  void keep_scan_index(Entropy first, bool handed_back);
  uint32_t fingerprint() const;

  [[noreturn]] void throw_last_error();
  // Refuses a header whose pixel count the file is too small to hold (see jpeg_decoder.cc).
  void check_claimed_size(size_t file_size) const;
  // Cuts the open image down to the restart intervals covering the scaled rectangle, when the
  // file allows it and it saves enough. Sets the cut's offset in scaled pixels.
  bool plan_restart_roi(int scale_denom, int x0, int y0, int x1, int y1, int& offset_x,
                        int& offset_y);
  // The same through the scan's index: `roi` is then the cut's header alone, and seek_mx0/my0
  // where its MCUs are in the file.
  bool plan_index_roi(int scale_denom, int x0, int y0, int x1, int y1, int& offset_x,
                      int& offset_y);
  // An MCU's width and height in the open image's pixels (at full scale).
  std::pair<int, int> mcu_size() const;
  // The MCUs covering the scaled rectangle, its left column a multiple of `left`, its end one of
  // `right` (or the row's); false when they are most of the image (not worth a second header
  // parse).
  bool plan_mcus(int scale_denom, int x0, int y0, int x1, int y1, int left, int right, int& mx0,
                 int& my0, int& mx1, int& my1) const;
  void decode_rows(int scale_denom, int x0, int y0, int x1, int y1, const DecodeOptions& options,
                   bool cmyk, bool inverted, bool partial_scans, std::vector<uint8_t>& pixels,
                   DecodedRegion& out);
  // Runs libjpeg calls with error_exit landing here. `body` must not hold objects with destructors
  // across a libjpeg call (longjmp skips them).
  template <typename Body>
  void guarded(Body&& body) {
    if (setjmp(err.jump)) throw_last_error();
    body();
  }

  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t entropy_begin = 0;
  bool layout_checked = false, layout_usable = false;
  RestartLayout layout;
  std::vector<uint8_t> roi;
  RestartHuffmanDecoder huffman;
  Entropy entropy = Entropy::kLibjpeg;  // decode_rows installs `huffman` unless kLibjpeg

  std::shared_ptr<ScanIndexCache> scan_indexes;  // null: no indexing
  int64_t scan_key = -1;                         // the open file's key; -1: none
  std::shared_ptr<const ScanIndex> scan_index;   // kSeek: the one it decodes through
  std::shared_ptr<ScanIndex> recording;          // kRecord: the one it fills
  std::shared_ptr<ScanIndex> extended;  // kSeek past the recorded rows: a copy recorded further
  int seek_mx0 = 0, seek_my0 = 0, seek_rows = 0;

  // Hands the tables of the image before back to recycle_table_memory and forgets them, so
  // that the next image starts with none, as a new decompress object would (jpeg_decoder.cc,
  // "One decompress object for a decoder's life").
  void forget_tables();

  jpeg_decompress_struct cinfo{};
  void* (*libjpeg_alloc_small)(j_common_ptr, int, size_t) = nullptr;
  std::vector<void*> spare_quant_tables, spare_huff_tables;
  ErrorManager err;
  jpeg_progress_mgr progress{};
  std::vector<JSAMPROW> rows;
  std::vector<uint8_t> cmyk_row;
};

// libspng's error as an Error: kResourceLimit for a limit it enforces, kCorruptData otherwise.
[[noreturn]] void throw_spng(int code, const char* what);
// Every PNG context of stoker's (images and masks): image limits from max_pixels, 64 MiB chunk
// limits, and the bytes to read. Throws through throw_spng; `what` names the file's role.
void configure_spng(spng_ctx* ctx, const uint8_t* data, size_t size, int64_t max_pixels,
                    const char* what);

struct PngDecoder {
  ~PngDecoder() { reset(); }
  void reset() {
    if (ctx) spng_ctx_free(ctx);
    ctx = nullptr;
  }
  ImageInfo read_header(const uint8_t* data, size_t size, const DecodeOptions& options);
  void decode(std::vector<uint8_t>& pixels, DecodedRegion& out);

  spng_ctx* ctx = nullptr;
  spng_ihdr ihdr{};
};

struct WebpDecoder {
  ImageInfo read_header(const uint8_t* data, size_t size, const DecodeOptions& options);
  // Decodes at least [x0, x1) x [y0, y1) (already clipped to the image), every pixel of the
  // result equal to the whole-image decode's.
  void decode(int x0, int y0, int x1, int y1, const DecodeOptions& options,
              std::vector<uint8_t>& pixels, DecodedRegion& out);

  const uint8_t* data = nullptr;
  size_t size = 0;
  WebPBitstreamFeatures features{};
  uint64_t working_bytes = 0;  // libwebp's own allocations for this image, estimated from above
};

}  // namespace detail
}  // namespace stoker::decode
