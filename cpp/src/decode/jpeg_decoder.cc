// libjpeg errors arrive through error_exit, which must not return: it longjmps back to the
// setjmp in the calling member function, which turns it into a stoker::Error. Functions that call
// setjmp create no C++ objects with destructors after it.
#include <jerror.h>

#include <algorithm>
#include <cstring>

#include "decode/detail/decoders.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"

namespace stoker::decode {

namespace {

using ErrorManager = detail::JpegDecoder::ErrorManager;

void on_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  std::longjmp(err->jump, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  // Corrupt but decodable. A fixed buffer: this runs inside libjpeg, where nothing may throw.
  if (err->warnings++ == 0) (*err->pub.format_message)(cinfo, err->first_warning);
}

void on_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (d->is_decompressor && d->progressive_mode && d->input_scan_number > err->max_scans) {
    err->scan_limit_hit = true;
    std::longjmp(err->jump, 1);
  }
}

ErrorCode classify(int msg_code) {
  switch (msg_code) {
    case JERR_BAD_PRECISION:
    case JERR_SOF_UNSUPPORTED:
    case JERR_NOT_COMPILED:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_BAD_J_COLORSPACE: return ErrorCode::kUnsupported;
    case JERR_IMAGE_TOO_BIG:
    case JERR_OUT_OF_MEMORY:
    case JERR_WIDTH_OVERFLOW:
    case JERR_NO_BACKING_STORE:  // libjpeg wanted more than max_memory_to_use
      return ErrorCode::kResourceLimit;
    default: return ErrorCode::kCorruptData;
  }
}

// Zigzag (scan) position of each natural-order coefficient: coef_bits is indexed by scan position.
constexpr int kZigzagOfNatural[64] = {
    0,  1,  5,  6,  14, 15, 27, 28, 2,  4,  7,  13, 16, 26, 29, 42, 3,  8,  12, 17, 25, 30,
    41, 43, 9,  11, 18, 24, 31, 40, 44, 53, 10, 19, 23, 32, 39, 45, 52, 54, 20, 22, 33, 38,
    46, 51, 55, 60, 21, 34, 37, 47, 50, 56, 59, 61, 35, 36, 48, 49, 57, 58, 62, 63};

// True once every coefficient that the 1/scale_denom IDCT reads (the top-left 8/scale_denom
// square of each block) is known to within its last bit, in every component. libjpeg's standard
// progressive script holds back the low bit of DC and AC (Al = 1) until its last scans, which are
// the largest: stopping before them changes a coefficient by at most one quantisation step (about
// one grey level at 1/8 scale) and saves most of the entropy decoding.
bool scans_sufficient(const jpeg_decompress_struct& cinfo, int scale_denom) {
  if (!cinfo.coef_bits) return false;
  const int block = 8 / scale_denom;
  for (int c = 0; c < cinfo.num_components; ++c)
    for (int r = 0; r < block; ++r)
      for (int k = 0; k < block; ++k) {
        const int missing_bits = cinfo.coef_bits[c][kZigzagOfNatural[r * 8 + k]];  // -1: none yet
        if (missing_bits < 0 || missing_bits > 1) return false;
      }
  return true;
}

// Whether libjpeg may apply block smoothing: a progressive file whose coefficients are not all
// complete (a file that ends early, or that never refines some coefficients). Conservative: any
// incomplete coefficient among the first 10 that smoothing estimates counts.
bool smoothing_possible(const jpeg_decompress_struct& cinfo) {
  if (!cinfo.progressive_mode || !cinfo.do_block_smoothing || !cinfo.coef_bits) return false;
  for (int c = 0; c < cinfo.num_components; ++c)
    for (int k = 1; k < 10; ++k)
      if (cinfo.coef_bits[c][k] != 0) return true;
  return false;
}

// Adobe's CMYK JPEGs store inverted values; PIL converts CMYK to RGB as (255-C)(255-K)/255.
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int width, bool inverted) {
  for (int x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
    const int k = inverted ? cmyk[3] : 255 - cmyk[3];
    for (int c = 0; c < 3; ++c) {
      const int v = inverted ? cmyk[c] : 255 - cmyk[c];
      const int t = v * k + 128;
      rgb[c] = static_cast<uint8_t>((t + (t >> 8)) >> 8);
    }
  }
}

// libjpeg's small allocations, with the blocks of forgotten tables handed out again: a table is
// the only JPOOL_PERMANENT allocation of its size after the object is created (the marker reader
// allocates it when an image defines a table whose slot is empty, jstdhuff.c when an image uses
// a Huffman table it never defines).
void* recycle_table_memory(j_common_ptr cinfo, int pool_id, size_t size) {
  auto* decoder = static_cast<detail::JpegDecoder*>(cinfo->client_data);
  if (pool_id == JPOOL_PERMANENT) {
    std::vector<void*>* spare = size == sizeof(JQUANT_TBL)  ? &decoder->spare_quant_tables
                                : size == sizeof(JHUFF_TBL) ? &decoder->spare_huff_tables
                                                            : nullptr;
    if (spare && !spare->empty()) {
      void* block = spare->back();
      spare->pop_back();
      return block;
    }
  }
  return decoder->libjpeg_alloc_small(cinfo, pool_id, size);
}

template <typename Table, size_t N>
void forget(Table* (&slots)[N], std::vector<void*>& spare) {
  for (Table*& table : slots)
    if (table != nullptr) {
      spare.push_back(table);
      table = nullptr;
    }
}

}  // namespace

// One decompress object for a decoder's life. A new object per image would start each image
// without the tables of the one before (what libjpeg keeps for abbreviated datastreams: an image
// using a table it never defines would decode with another image's), but creating one reads the
// environment (getenv("JPEGMEM") in libjpeg's memory manager), and a getenv on a worker thread
// races with Python code that changes os.environ (accelerate clears and restores the whole
// environment while Trainer starts): glibc may free the environment array under the reader, and
// the process died of SIGSEGV. So an image starts with jpeg_abort_decompress, as TurboJPEG's
// reuse does, and forget_tables() empties every table slot: the image defines its own or fails
// (or gets the standard Huffman tables) exactly as on a new object, and the tables' memory is
// handed out again (recycle_table_memory) so it stays bounded.
detail::JpegDecoder::JpegDecoder() {
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error_exit;
  err.pub.emit_message = on_message;
  cinfo.client_data = this;  // kept by jpeg_create_decompress
  guarded([&] { jpeg_create_decompress(&cinfo); });
  libjpeg_alloc_small = cinfo.mem->alloc_small;
  cinfo.mem->alloc_small = recycle_table_memory;
  progress.progress_monitor = on_progress;
  cinfo.progress = &progress;
}

void detail::JpegDecoder::forget_tables() {
  forget(cinfo.quant_tbl_ptrs, spare_quant_tables);
  forget(cinfo.dc_huff_tbl_ptrs, spare_huff_tables);
  forget(cinfo.ac_huff_tbl_ptrs, spare_huff_tables);
}

detail::JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&cinfo); }

void detail::JpegDecoder::throw_last_error() {
  jpeg_abort_decompress(&cinfo);
  if (err.scan_limit_hit)
    throw_error(ErrorCode::kResourceLimit,
                "progressive JPEG has more than " + std::to_string(err.max_scans) + " scans");
  if (err.pub.msg_code == JERR_NO_BACKING_STORE)
    throw_error(ErrorCode::kResourceLimit, "decoding needs more than max_decode_memory=" +
                                               std::to_string(cinfo.mem->max_memory_to_use) +
                                               " bytes");
  char message[JMSG_LENGTH_MAX] = {};
  (*err.pub.format_message)(reinterpret_cast<j_common_ptr>(&cinfo), message);
  throw_error(classify(err.pub.msg_code), message);
}

ImageInfo detail::JpegDecoder::read_header(const uint8_t* data, size_t size,
                                           const DecodeOptions& options) {
  err.warnings = 0;
  err.first_warning[0] = '\0';
  err.scan_limit_hit = false;
  err.max_scans = options.max_scans;
  // As a new decompress object (see the constructor): nothing of the image before, its tables
  // included, so that an image that uses a table it never defines (a Motion-JPEG frame relying
  // on the standard Huffman tables) or defines only after the scan that uses it decodes as it
  // would alone, and an image opened and never decoded (its crop failed, say) is harmless.
  jpeg_abort_decompress(&cinfo);
  forget_tables();
  guarded([&] {
    cinfo.progress = &progress;
    jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo, TRUE);
  });
  this->data = data;
  this->size = size;
  entropy_begin = static_cast<size_t>(cinfo.src->next_input_byte - data);
  check_claimed_size(size);
  // libjpeg asks its memory manager before allocating the large arrays (the whole-image
  // coefficient buffer of a progressive file); past this it fails with JERR_NO_BACKING_STORE.
  cinfo.mem->max_memory_to_use = static_cast<long>(options.max_decode_memory);
  layout_checked = layout_usable = false;
  ImageInfo info;
  info.format = ImageFormat::kJpeg;
  info.width = static_cast<int>(cinfo.image_width);
  info.height = static_cast<int>(cinfo.image_height);
  info.components = cinfo.num_components;
  info.progressive = cinfo.progressive_mode;
  info.ycbcr = cinfo.num_components == 3 && cinfo.jpeg_color_space == JCS_YCbCr;
  return info;
}

bool detail::JpegDecoder::starts(const uint8_t* file, size_t file_size,
                                 const DecodeOptions& options) {
  // Several scans (progressive, or a component a scan): starting reads them all.
  if (cinfo.progressive_mode || cinfo.comps_in_scan < cinfo.num_components) return true;
  bool started = true;
  try {
    // At full scale, into the colour space libjpeg chose for the file (read_header's
    // defaults). One scan: sets the decoder up and latches the scan's tables
    // (master_selection's start_input_pass), reading no entropy-coded data.
    guarded([&] { jpeg_start_decompress(&cinfo); });
  } catch (const Error&) {
    started = false;
  }
  const int64_t key = scan_key;
  read_header(file, file_size, options);
  scan_key = key;
  return started;
}

void detail::JpegDecoder::check_claimed_size(size_t file_size) const {
  // A bomb is a few hundred bytes claiming tens of thousands of pixels a side. Huffman coding
  // spends at least one bit on every 8x8 block of a component in its first scan (its DC
  // difference; an AC-first or refinement scan can cover a run of blocks with one code, a DC scan
  // cannot), so a file holding less than a bit per block of its smallest component cannot hold
  // even one scan: it is refused before anything is allocated. Arithmetic coding can spend less
  // than a bit per block and is left to max_pixels and max_decode_memory.
  if (cinfo.arith_code) return;
  uint64_t blocks = UINT64_MAX;
  for (int c = 0; c < cinfo.num_components; ++c) {
    const jpeg_component_info& comp = cinfo.comp_info[c];
    blocks = std::min<uint64_t>(blocks, uint64_t{comp.width_in_blocks} * comp.height_in_blocks);
  }
  const uint64_t needed = blocks / 8;
  if (file_size < needed)
    throw_error(ErrorCode::kCorruptData,
                "a " + std::to_string(cinfo.image_width) + "x" +
                    std::to_string(cinfo.image_height) + " JPEG needs at least " +
                    std::to_string(needed) + " bytes of image data, the file has " +
                    std::to_string(file_size) + " (truncated, or a decompression bomb)");
}

void detail::JpegDecoder::decode(int scale_denom, int x0, int y0, int x1, int y1,
                                 const DecodeOptions& options, std::vector<uint8_t>& pixels,
                                 DecodedRegion& out) {
  // A scan with restart markers goes to stoker's Huffman decoder (restart_huffman.h) first; so
  // does one without that has a ScanIndex, or is to get one. When it hands the scan back
  // (damaged data, a marker out of place), the same decode runs again with libjpeg's, from the
  // header on, and the warnings counted since open() are forgotten.
  huffman.bailed = huffman.installed = false;
  Entropy first = Entropy::kLibjpeg;
  const bool sequential = !options.read_to_end && !cinfo.progressive_mode && !cinfo.arith_code;
  if (sequential && options.restart_huffman && cinfo.restart_interval != 0) {
    first = Entropy::kRestart;
  } else if (sequential && scan_indexes && scan_key >= 0 && cinfo.restart_interval == 0 &&
             cinfo.comps_in_scan == cinfo.num_components) {
    scan_index = find_scan_index();
    if (!scan_index) {
      if (scan_indexes->has_room()) first = Entropy::kRecord;
    } else if (!scan_index->empty()) {
      first = Entropy::kSeek;
    }
  }
  if (first != Entropy::kLibjpeg) {
    const int warnings = err.warnings;
    try {
      decode_once(scale_denom, x0, y0, x1, y1, options, first, pixels, out);
      keep_scan_index(first, false);
      return;
    } catch (const Error&) {
      if (!huffman.bailed) {
        recording = extended = nullptr;
        scan_index = nullptr;
        throw;
      }
    }
    keep_scan_index(first, true);
    guarded([&] {
      jpeg_abort_decompress(&cinfo);
      jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
      jpeg_read_header(&cinfo, TRUE);
    });
    err.warnings = warnings;  // those of the header again, and of the first try
    if (warnings == 0) err.first_warning[0] = '\0';
  }
  decode_once(scale_denom, x0, y0, x1, y1, options, Entropy::kLibjpeg, pixels, out);
}

void detail::JpegDecoder::keep_scan_index(Entropy first, bool handed_back) {
  const auto key = static_cast<uint64_t>(scan_key);
  if (first == Entropy::kRecord) {
    // An empty index (the scan handed back, or not one the decoder indexes) keeps the file from
    // being tried again; an index of no whole row is no use.
    if (huffman.installed && !handed_back) huffman.end_recording();
    if (!huffman.installed || handed_back) *recording = ScanIndex{};
    recording->file_size = size;
    recording->fingerprint = fingerprint();
    if (recording->empty() || recording->rows > 0) scan_indexes->insert(key, std::move(recording));
  } else if (first == Entropy::kSeek && extended && !handed_back) {
    scan_indexes->insert(key, std::move(extended));
  } else if (first == Entropy::kSeek && extended) {
    // Recording further failed (damaged data below): the index as it was, not to be tried again.
    auto stop = std::make_shared<ScanIndex>(*scan_index);
    stop->max_rows = stop->rows;
    scan_indexes->insert(key, std::move(stop));
  }
  // Nothing of this image kept past its decode but in the cache.
  recording = extended = nullptr;
  scan_index = nullptr;
}

uint32_t detail::JpegDecoder::fingerprint() const {
  const size_t tail = std::min<size_t>(64, size - entropy_begin);
  return crc32c(data + size - tail, tail, crc32c(data, entropy_begin));
}

std::shared_ptr<const ScanIndex> detail::JpegDecoder::find_scan_index() const {
  std::shared_ptr<const ScanIndex> found = scan_indexes->find(static_cast<uint64_t>(scan_key));
  if (found && (found->file_size != size || found->fingerprint != fingerprint())) return nullptr;
  return found;
}

void detail::JpegDecoder::decode_once(int scale_denom, int x0, int y0, int x1, int y1,
                                      const DecodeOptions& options, Entropy first,
                                      std::vector<uint8_t>& pixels, DecodedRegion& out) {
  entropy = first;
  extended = nullptr;
  if (first == Entropy::kRecord) recording = std::make_shared<ScanIndex>();
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  const bool inverted = cinfo.saw_Adobe_marker;
  // A scaled IDCT reads only low-frequency coefficients: a progressive file needs only the scans
  // that carry them (at 1/8, the DC scans alone).
  const bool partial_scans =
      cinfo.progressive_mode && scale_denom > 1 && options.progressive_shortcut;
  int offset_x = 0, offset_y = 0;
  const bool cut = first == Entropy::kSeek
                       ? plan_index_roi(scale_denom, x0, y0, x1, y1, offset_x, offset_y)
                       : !partial_scans && options.restart_roi &&
                             plan_restart_roi(scale_denom, x0, y0, x1, y1, offset_x, offset_y);
  if (cut) {
    const int scaled_w = scaled_size(static_cast<int>(cinfo.image_width), scale_denom);
    const int scaled_h = scaled_size(static_cast<int>(cinfo.image_height), scale_denom);
    guarded([&] {
      jpeg_abort_decompress(&cinfo);
      jpeg_mem_src(&cinfo, roi.data(), static_cast<unsigned long>(roi.size()));
      // The cut's headers are the file's: their warnings were counted when it was opened.
      const int warnings = err.warnings;
      char first_warning[JMSG_LENGTH_MAX];
      std::memcpy(first_warning, err.first_warning, sizeof first_warning);
      jpeg_read_header(&cinfo, TRUE);
      err.warnings = warnings;
      std::memcpy(err.first_warning, first_warning, sizeof first_warning);
      const int w = scaled_size(static_cast<int>(cinfo.image_width), scale_denom);
      const int h = scaled_size(static_cast<int>(cinfo.image_height), scale_denom);
      decode_rows(scale_denom, x0 - offset_x, y0 - offset_y, std::min(w, x1 - offset_x),
                  std::min(h, y1 - offset_y), options, cmyk, inverted, false, pixels, out);
    });
    out.origin_x += offset_x;
    out.origin_y += offset_y;
    out.scaled_width = scaled_w;
    out.scaled_height = scaled_h;
    return;
  }
  if (first == Entropy::kSeek) entropy = Entropy::kLibjpeg;  // most of the image: no cut
  guarded([&] {
    decode_rows(scale_denom, x0, y0, x1, y1, options, cmyk, inverted, partial_scans, pixels, out);
  });
}

std::pair<int, int> detail::JpegDecoder::mcu_size() const {
  if (cinfo.comps_in_scan == 1) return {8, 8};  // one component: its blocks are the MCUs
  return {8 * cinfo.max_h_samp_factor, 8 * cinfo.max_v_samp_factor};
}

bool detail::JpegDecoder::plan_mcus(int scale_denom, int x0, int y0, int x1, int y1, int left,
                                    int right, int& mx0, int& my0, int& mx1, int& my1) const {
  const auto [mcu_w, mcu_h] = mcu_size();
  const int width = static_cast<int>(cinfo.image_width);
  const int height = static_cast<int>(cinfo.image_height);
  const int mcus_per_row = (width + mcu_w - 1) / mcu_w;
  const int mcu_rows = (height + mcu_h - 1) / mcu_h;
  mx0 = x0 * scale_denom / mcu_w / left * left;
  mx1 =
      std::min(mcus_per_row, ((std::min(width, x1 * scale_denom) + mcu_w - 1) / mcu_w + right - 1) /
                                 right * right);
  my0 = y0 * scale_denom / mcu_h;
  my1 = std::min(mcu_rows, (std::min(height, y1 * scale_denom) + mcu_h - 1) / mcu_h);
  if (mx1 <= mx0 || my1 <= my0) return false;
  // Not worth a second header parse when the cut keeps most of the image.
  const int64_t kept = int64_t{mx1 - mx0} * (my1 - my0);
  return kept * 10 <= int64_t{mcus_per_row} * mcu_rows * 9;
}

bool detail::JpegDecoder::plan_restart_roi(int scale_denom, int x0, int y0, int x1, int y1,
                                           int& offset_x, int& offset_y) {
  if (cinfo.progressive_mode || cinfo.arith_code || cinfo.restart_interval == 0 ||
      cinfo.comps_in_scan != cinfo.num_components)
    return false;
  const auto [mcu_w, mcu_h] = mcu_size();
  if (!layout_checked) {
    layout_checked = true;
    layout_usable =
        parse_restart_layout(data, size, entropy_begin, static_cast<int>(cinfo.image_width),
                             static_cast<int>(cinfo.image_height), mcu_w, mcu_h,
                             static_cast<int>(cinfo.restart_interval), layout);
  }
  int mx0, my0, mx1, my1;
  if (!layout_usable ||
      !plan_mcus(scale_denom, x0, y0, x1, y1, layout.interval, layout.interval, mx0, my0, mx1, my1))
    return false;
  build_roi_jpeg(data, layout, mx0, my0, mx1, my1, roi);
  offset_x = mx0 * mcu_w / scale_denom;
  offset_y = my0 * mcu_h / scale_denom;
  return true;
}

bool detail::JpegDecoder::plan_index_roi(int scale_denom, int x0, int y0, int x1, int y1,
                                         int& offset_x, int& offset_y) {
  const auto [mcu_w, mcu_h] = mcu_size();
  // Each row of the cut starts at a recorded point; it may end at any MCU.
  int mx0, my0, mx1, my1;
  if (!plan_mcus(scale_denom, x0, y0, x1, y1, scan_index->step, 1, mx0, my0, mx1, my1))
    return false;
  // The rows the index must have: the cut's, and the one below, which libjpeg decodes for its
  // chroma upsampling's context when the rectangle ends near the cut's bottom (a damaged row
  // there is a warning of libjpeg's; recording it first finds it, and hands the decode back).
  seek_rows = std::min(scan_index->mcu_rows, my1 + 1);
  if (seek_rows > scan_index->rows &&
      (seek_rows > scan_index->max_rows || !scan_indexes->has_room()))
    return false;  // not to be recorded further: damage below, or the cache is full
  const size_t sof = find_baseline_sof(data, entropy_begin);
  if (sof == 0) return false;
  const int width = static_cast<int>(cinfo.image_width);
  const int height = static_cast<int>(cinfo.image_height);
  build_header_jpeg(data, entropy_begin, sof, std::min(width, mx1 * mcu_w) - mx0 * mcu_w,
                    std::min(height, my1 * mcu_h) - my0 * mcu_h, roi);
  seek_mx0 = mx0;
  seek_my0 = my0;
  // Rows below the recorded ones: recorded first, into a copy (the cache's is shared).
  extended = seek_rows > scan_index->rows ? std::make_shared<ScanIndex>(*scan_index) : nullptr;
  offset_x = mx0 * mcu_w / scale_denom;
  offset_y = my0 * mcu_h / scale_denom;
  return true;
}

void detail::JpegDecoder::decode_rows(int scale_denom, int x0, int y0, int x1, int y1,
                                      const DecodeOptions& options, bool cmyk, bool inverted,
                                      bool partial_scans, std::vector<uint8_t>& pixels,
                                      DecodedRegion& out) {
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(scale_denom);
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.do_fancy_upsampling = options.fast_upsampling ? FALSE : TRUE;
  cinfo.dct_method = options.fast_idct ? JDCT_IFAST : JDCT_ISLOW;
  cinfo.buffered_image = partial_scans ? TRUE : FALSE;
  // libjpeg's default, as djpeg and PIL use: incomplete progressive files (truncated downloads,
  // files that stop before the last refinement scan) get their missing AC coefficients estimated.
  // (Not when stopping early on purpose: the held-back low bits are then not worth estimating.)
  cinfo.do_block_smoothing = partial_scans ? FALSE : TRUE;
  jpeg_start_decompress(&cinfo);
  // Before any MCU is decoded (skipping rows decodes them).
  switch (entropy) {
    case Entropy::kLibjpeg: break;
    case Entropy::kRestart: huffman.install(&cinfo); break;
    case Entropy::kRecord:
      huffman.install_recording(&cinfo, data + entropy_begin, *recording);
      break;
    case Entropy::kSeek:
      if (!huffman.install_seeking(&cinfo, data + entropy_begin, data + size,
                                   extended ? *extended : *scan_index, seek_mx0, seek_my0,
                                   seek_rows, extended.get())) {
        huffman.bailed = true;  // libjpeg has the header alone: decode the file instead
        throw_error(ErrorCode::kInternal, "the scan index does not fit the file");
      }
      break;
  }
  if (partial_scans) {
    while (!scans_sufficient(cinfo, scale_denom)) {
      const int status = jpeg_consume_input(&cinfo);
      if (status == JPEG_REACHED_EOI || status == JPEG_SUSPENDED) break;
    }
    jpeg_start_output(&cinfo, cinfo.input_scan_number);
  }
  const int scaled_width = static_cast<int>(cinfo.output_width);
  const int scaled_height = static_cast<int>(cinfo.output_height);
  auto crop_x = static_cast<JDIMENSION>(x0);
  auto crop_w = static_cast<JDIMENSION>(x1 - x0);
  if (crop_x > 0 || crop_w < cinfo.output_width) {
    if (crop_x > 0 && smoothing_possible(cinfo)) {
      // Smoothing reads the DC values of the two block columns to the left of each block, but
      // libjpeg takes the first column of a crop for the image's left edge. Starting three iMCU
      // columns earlier keeps the blocks it gets wrong (and their chroma upsampling) out of
      // the requested region, so that a region decodes exactly as the whole image does.
      const auto imcu =
          static_cast<JDIMENSION>(cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size);
      const JDIMENSION back = std::min<JDIMENSION>(crop_x, 3 * imcu);
      crop_x -= back;
      crop_w += back;
    }
    jpeg_crop_scanline(&cinfo, &crop_x, &crop_w);  // widens to iMCU boundaries
  }
  const int width = static_cast<int>(crop_w);
  const int height = y1 - y0;
  const size_t stride = static_cast<size_t>(width) * 3;
  if (stride * static_cast<size_t>(height) > static_cast<uint64_t>(options.max_decode_memory))
    throw_error(ErrorCode::kResourceLimit, "the decoded region needs more than max_decode_memory=" +
                                               std::to_string(options.max_decode_memory) +
                                               " bytes");
  pixels.resize(stride * static_cast<size_t>(height));
  if (cmyk) cmyk_row.resize(static_cast<size_t>(width) * 4);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  rows.resize(static_cast<size_t>(height));
  for (int r = 0; r < height; ++r) rows[r] = pixels.data() + stride * r;
  int done = 0;
  while (done < height) {
    if (cmyk) {
      JSAMPROW row = cmyk_row.data();
      if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) break;
      cmyk_to_rgb(cmyk_row.data(), rows[done], width, inverted);
      ++done;
    } else {
      const JDIMENSION n =
          jpeg_read_scanlines(&cinfo, rows.data() + done, static_cast<JDIMENSION>(height - done));
      if (n == 0) break;
      done += static_cast<int>(n);
    }
  }
  if (options.read_to_end && !partial_scans && cinfo.output_scanline == cinfo.output_height)
    jpeg_finish_decompress(&cinfo);  // reads (and checks) what follows the last row
  else
    jpeg_abort_decompress(&cinfo);  // stop here: the rows below the crop are never decoded
  if (done < height)
    throw_error(ErrorCode::kCorruptData, "decoder stopped after " + std::to_string(done) + " of " +
                                             std::to_string(height) + " rows");
  out.pixels = pixels.data();
  out.width = width;
  out.height = height;
  out.stride = static_cast<ptrdiff_t>(stride);
  out.origin_x = static_cast<int>(crop_x);
  out.origin_y = y0;
  out.scaled_width = scaled_width;
  out.scaled_height = scaled_height;
  out.scale_denom = scale_denom;
}

}  // namespace stoker::decode
