// Lossless re-writing of a baseline JPEG with restart markers, at pack time: the DCT coefficients
// are copied as they are, so every decoded pixel stays the same.
#include <jerror.h>

#include <csetjmp>
#include <cstdio>
#include <memory>

// clang-format off
#include <jpeglib.h>
// clang-format on

#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"

namespace stoker::decode {

namespace {

struct TranscodeError {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
};

void on_transcode_error(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<TranscodeError*>(cinfo->err)->jump, 1);
}

void ignore_message(j_common_ptr, int) {}

// All libjpeg state lives here, so that a longjmp out of libjpeg skips no C++ destructor.
struct Transcoder {
  jpeg_decompress_struct in{};
  jpeg_compress_struct out{};
  TranscodeError err{};  // shared: one landing point for either side
  unsigned char* buffer = nullptr;
  unsigned long buffer_size = 0;
  char message[JMSG_LENGTH_MAX] = {};

  Transcoder() {
    in.err = out.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_transcode_error;
    err.pub.emit_message = ignore_message;
    jpeg_create_decompress(&in);
    jpeg_create_compress(&out);
  }
  ~Transcoder() {
    jpeg_destroy_compress(&out);
    jpeg_destroy_decompress(&in);
    std::free(buffer);
  }

  // Returns false when the file is not a candidate (progressive, arithmetic, restart markers
  // already, MCU row not divisible by the interval); throws on libjpeg errors.
  bool run(const uint8_t* data, size_t size, int interval_mcus) {
    if (setjmp(err.jump)) {
      (*err.pub.format_message)(reinterpret_cast<j_common_ptr>(&in), message);
      throw Error(ErrorCode::kCorruptData, message);
    }
    jpeg_mem_src(&in, data, static_cast<unsigned long>(size));
    jpeg_read_header(&in, TRUE);
    if (in.progressive_mode || in.arith_code || in.restart_interval != 0 ||
        in.comps_in_scan != in.num_components)
      return false;
    const int mcu_w = in.comps_in_scan == 1 ? 8 : 8 * in.max_h_samp_factor;
    const int mcus_per_row = (static_cast<int>(in.image_width) + mcu_w - 1) / mcu_w;
    if (mcus_per_row % interval_mcus != 0) return false;
    jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&in);
    jpeg_mem_dest(&out, &buffer, &buffer_size);
    jpeg_copy_critical_parameters(&in, &out);
    // The markers a decoder reads the colour space from, as the original has them: libjpeg would
    // write those of the colour space it guessed, and an Adobe marker the original lacks makes a
    // CMYK file read as inverted (jpeg_decoder.cc, cmyk_to_rgb).
    out.write_JFIF_header = in.saw_JFIF_marker;
    out.write_Adobe_marker = in.saw_Adobe_marker;
    out.restart_interval = static_cast<unsigned>(interval_mcus);
    out.optimize_coding = TRUE;  // per-image Huffman tables: the markers' cost is all we add
    jpeg_write_coefficients(&out, coefficients);
    jpeg_finish_compress(&out);
    jpeg_finish_decompress(&in);
    return true;
  }
};

}  // namespace

bool add_restart_markers(const uint8_t* data, size_t size, int interval_mcus,
                         std::vector<uint8_t>& out) {
  STOKER_CHECK(interval_mcus >= 1 && interval_mcus <= 65535, ErrorCode::kInvalidArgument,
               "restart interval must be 1-65535 MCUs");
  auto t = std::make_unique<Transcoder>();
  if (!t->run(data, size, interval_mcus)) return false;
  out.assign(t->buffer, t->buffer + t->buffer_size);
  return true;
}

}  // namespace stoker::decode
