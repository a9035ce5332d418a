// Decodes JPEG (libjpeg-turbo), PNG (libspng) and WebP (libwebp) to RGB8, doing only the work a
// crop needs: JPEG is decoded at the smallest DCT scale the caller allows, only the rows and
// (iMCU-aligned) columns of the requested rectangle, and progressive JPEGs at 1/8 scale read only
// their DC scans; WebP stops after the last row the rectangle needs and converts only its columns.
// Grayscale, CMYK and YCCK become RGB; alpha is dropped (PIL's convert("RGB")). EXIF orientation
// is not applied (neither does PIL's open).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/core/image_format.h"
#include "stoker/decode/scan_index.h"

namespace stoker::decode {

namespace detail {
struct JpegDecoder;
struct PngDecoder;
struct WebpDecoder;
}  // namespace detail

struct DecodeOptions {
  int64_t max_pixels = int64_t{1} << 28;  // width * height above this: Error(kResourceLimit)
  int max_scans = 256;  // progressive JPEG scans above this: Error(kResourceLimit)
  // Bytes one image may take in the decoder: libjpeg's working memory (a progressive JPEG keeps
  // every coefficient of the image: 3 bytes per pixel at 4:2:0), the decoded pixels, a PNG's RGBA
  // buffer, libwebp's planes (a lossless WebP: 4 bytes per pixel of the whole image). Above it:
  // Error(kResourceLimit), raised before the memory is allocated.
  int64_t max_decode_memory = int64_t{512} << 20;
  bool fast_upsampling = false;  // libjpeg's do_fancy_upsampling off: faster chroma, less exact
  // libjpeg's JDCT_IFAST instead of JDCT_ISLOW wherever it runs an 8x8 IDCT (full scale, and
  // 4:2:0 chroma at 1/2; the smaller IDCTs have one method only): less exact, 44 dB from the
  // accurate IDCT at the loader's outputs on imagenet-sample (benchmarks/idct_quality.py).
  bool fast_idct = false;
  // Progressive JPEGs decoded at 1/2, 1/4 or 1/8 stop reading once the coefficients that scale
  // uses are known to within their last bit (40-50 dB from the exact result, several times
  // faster). false: read every scan.
  bool progressive_shortcut = true;
  // Baseline JPEGs with restart markers at row-aligned intervals (see stoker.pack's
  // restart_interval) are cut to the intervals a crop covers before entropy decoding. Exact.
  bool restart_roi = true;
  // Scans with restart markers are entropy-decoded by stoker's Huffman decoder rather than
  // libjpeg-turbo's, which takes its slow path for them (6-8% more CPU a crop). The same
  // coefficients, so the same pixels; anything unusual in the data goes back to libjpeg's.
  bool restart_huffman = true;
  // Baseline JPEGs without restart markers, opened with a sample key and decoded by an
  // ImageDecoder given a ScanIndexCache: the first decode records where each MCU row's data
  // starts, down to the crop's (scan_index.h), the later ones entropy-decode only the crop's
  // rows and columns from there, as the restart cut does. Exact.
  bool scan_index = true;
  // The memory a loader's field gives its ScanIndexCache (up to about 7 KB an ImageNet-sized
  // image); images past it decode as before.
  int64_t max_scan_index_memory = int64_t{256} << 20;
  // A JPEG decoded down to its last row goes on reading to the end-of-image marker, so that
  // damage after the image data (a tail zeroed or cut off, junk before EOI) is reported as a
  // warning or an error. The loader never needs those bytes; verification does.
  bool read_to_end = false;
};

struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0, height = 0;
  int components = 0;
  bool progressive = false;
  // A JPEG of 3 components that libjpeg reads as YCbCr (false where its JFIF and Adobe markers
  // and component ids say RGB: an Adobe marker with transform 0, ids 'R', 'G', 'B').
  bool ycbcr = false;
};

// RGB8 pixels of a region of the image scaled by 1/scale_denom, whose top-left pixel is pixel
// (origin_x, origin_y) of the scaled image (scaled_width x scaled_height).
struct DecodedRegion {
  const uint8_t* pixels = nullptr;
  int width = 0, height = 0;
  ptrdiff_t stride = 0;
  int origin_x = 0, origin_y = 0;
  int scaled_width = 0, scaled_height = 0;
  int scale_denom = 1;
};

// Size of the image scaled by 1/denom, as libjpeg computes it (rounded up).
inline int scaled_size(int size, int denom) { return (size + denom - 1) / denom; }

// Not thread-safe: use one per thread. Reuses its pixel buffer across images; libjpeg state is
// made afresh for each image, so no table of one image reaches the next.
// The bytes given to open() must stay alive until decode() returns.
class ImageDecoder {
 public:
  // `scan_indexes`: where the decoder keeps and finds the ScanIndex of a JPEG opened with a key
  // (DecodeOptions::scan_index); shared by the decoders of one field of one loader.
  explicit ImageDecoder(DecodeOptions options = {},
                        std::shared_ptr<ScanIndexCache> scan_indexes = nullptr);
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Reads the header. Throws Error (kCorruptData, kUnsupported, kResourceLimit) with the decoder's
  // own message as the reason.
  // `key` names the file among those this decoder's ScanIndexCache sees (the loader's sample
  // number); -1: none, the file is not indexed.
  const ImageInfo& open(const uint8_t* data, size_t size, int64_t key = -1);
  // Pixels instead of a file (an array pack's image row): height x width x channels uint8, rows
  // packed, channels 1 (grey) or 3 (RGB); `size` must be exactly that. Nothing is decoded:
  // decode() points into them (RGB) or makes RGB of the rows it is asked for (grey). The same
  // for a PPM (P6) or PGM (P5) file given to open(): its header is read, then its pixels.
  const ImageInfo& open_raw(const uint8_t* pixels, size_t size, int width, int height,
                            int channels);

  // Scales the decoder can use for the open image: {1, 2, 4, 8} for JPEG, {1} for PNG and WebP.
  // Other DCT scales (3/4, 5/8, ...) are slower than a full decode in libjpeg-turbo 2.1, so they
  // are not used.
  int max_scale_denom() const;

  // Whether libjpeg starts decompressing the open JPEG without an error: its quantisation tables
  // defined, its Huffman tables valid, its sampling usable (the failures it raises before any
  // pixel); no pixel is decoded, and the image stays open. True for a JPEG of several scans
  // (starting one reads all of them) and for other formats.
  bool starts();

  // Decodes the open image at 1/scale_denom, covering at least the scaled-image rectangle
  // [x0, x1) x [y0, y1) (clipped to the image). The result stays valid until the next call.
  // A WebP region is exact: every pixel of it equals the whole-image decode's (libwebp's crop is
  // widened by a pixel where its chroma upsampling would treat the crop's edge as the image's).
  const DecodedRegion& decode(int scale_denom, int x0, int y0, int x1, int y1);
  // The whole image at full size.
  const DecodedRegion& decode_full();

  // Number of libjpeg warnings (recoverable corruption: a truncated file, damaged entropy data)
  // seen since the last open(), and the text of the first one ("" when none).
  int warnings() const;
  std::string first_warning() const;

 private:
  DecodeOptions options_;
  ImageInfo info_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::unique_ptr<detail::JpegDecoder> jpeg_;
  std::unique_ptr<detail::PngDecoder> png_;
  std::unique_ptr<detail::WebpDecoder> webp_;
  std::vector<uint8_t> pixels_;
  DecodedRegion region_;
  const uint8_t* raw_ = nullptr;  // kPnm, kRaw: the first pixel
  int raw_channels_ = 0;
};

// Rewrites a baseline JPEG losslessly (same DCT coefficients, same pixels) with a restart marker
// every `interval_mcus` MCUs, so that ImageDecoder can entropy-decode only the part a crop needs.
// Returns false, leaving `out` alone, for files it does not apply to: progressive or arithmetic
// coded, already with restart markers, multi-scan, or an MCU row not divisible by the interval.
// Throws Error(kCorruptData) when the file does not parse.
bool add_restart_markers(const uint8_t* data, size_t size, int interval_mcus,
                         std::vector<uint8_t>& out);

// Encodes RGB8 pixels as a baseline JPEG (4:2:0) with TurboJPEG.
std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, ptrdiff_t stride,
                                 int quality);

// Does on the calling thread what libjpeg-turbo does once per thread, on its first decode: its
// SIMD detection reads the environment (getenv). A thread that decodes while Python code may
// change os.environ (a getenv racing with putenv can fault in glibc) calls this first, at a time
// when that cannot happen: the loader's workers before its constructor returns to Python, which
// holds the GIL meanwhile. Creating a decoder reads the environment too (libjpeg's memory
// manager), so such threads create theirs then as well.
void prepare_thread_for_decoding();

}  // namespace stoker::decode
