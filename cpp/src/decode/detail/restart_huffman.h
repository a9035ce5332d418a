// A baseline Huffman decoder put in place of libjpeg-turbo's own, for scans with restart markers
// (the crops that the restart cut, restart_roi.h, hands libjpeg) and for scans without them that
// it indexes or enters through an index (stoker/decode/scan_index.h). libjpeg-turbo 2.1 decodes any
// scan with a restart interval on its slow path (jdhuff.c: usefast = 0 whenever restart_interval
// is set), 6-8% more CPU for the same crop (benchmarks/decoder_limit.py); this one reads a 64-bit
// buffer with a 9-bit lookup table whether or not the scan has markers.
//
// It produces the coefficients libjpeg would, or none: anything libjpeg would warn about or treat
// specially (a code no table has, data running into a marker, a marker out of sequence, bytes
// left over before one, a coefficient index or DC value out of range) stops it with `bailed` set,
// through libjpeg's error_exit, and the caller decodes the same cut again with libjpeg's decoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>  // before jpeglib.h, which uses FILE without including it

// clang-format off
#include <jpeglib.h>
// clang-format on

#include "stoker/decode/scan_index.h"

namespace stoker::decode::detail {

// libjpeg's struct jpeg_entropy_decoder (jpegint.h, the same since libjpeg 6b): what its
// coefficient controller calls for each MCU.
struct EntropyDecoderHead {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
  boolean insufficient_data;
};

struct HuffmanTable {
  static constexpr int kLookahead = 9;
  // The next kLookahead bits -> (code length << 8) | symbol; 0 for a longer code.
  uint16_t fast[1 << kLookahead];
  int32_t max_code[17];      // the largest code of each length (1-16), -1 for none
  int32_t value_offset[17];  // code + value_offset[length] indexes values
  uint8_t values[256];
  // False for a table libjpeg would refuse (it has accepted the ones this is given).
  bool build(const JHUFF_TBL& table);
};

// Where the decoder is in the entropy-coded data. decode_mcu works on a copy in locals (the
// compiler keeps it in registers) and stores it back after each MCU.
struct BitReader {
  const uint8_t* next;  // the next byte
  const uint8_t* end;
  uint64_t bits;  // the next bit is the top one
  int count;      // bits buffered
  int zero_bits;  // how many of them are zeros read past a marker (not data)
  bool at_marker;
};

struct RestartHuffmanDecoder {
  enum class Mode {
    kRestart,  // a scan with restart markers
    kRecord,   // a scan without: decode it and record its ScanIndex
    kSeek,     // the crop's rows of a scan without, each entered at its ScanIndex point
  };
  // Each replaces libjpeg's entropy decoder for the scan just started (call right after
  // jpeg_start_decompress, before any row is read) when it is one this decodes: sequential
  // Huffman, all components in one scan, every component needed, the data in memory; a restart
  // interval for install(), none for the others. Returns whether it did.
  bool install(j_decompress_ptr cinfo);
  // Records into `index` (its dimensions set here) as libjpeg asks for MCUs, then
  // end_recording() keeps its whole rows. `entropy` is where the scan's data begins.
  bool install_recording(j_decompress_ptr cinfo, const uint8_t* entropy, ScanIndex& index);
  // libjpeg decodes a header-only image (build_header_jpeg) of MCU columns [mx0, mx0 +
  // cinfo->MCUs_per_row) and rows [my0, ...) of the indexed one, whose entropy-coded data is
  // [entropy, end); mx0 is a multiple of index.step. The index must have `rows` rows (at least
  // the cut's): where it has fewer, `own` must point at it (the caller's copy, not the cache's),
  // and the rows past the recorded ones are recorded into it first (their MCUs decoded without
  // coefficients). Bails (through error_exit) as decoding does. Unlike the others, a false
  // return leaves libjpeg with a scan it has no data for: the caller must not decode it.
  bool install_seeking(j_decompress_ptr cinfo, const uint8_t* entropy, const uint8_t* end,
                       const ScanIndex& index, int mx0, int my0, int rows, ScanIndex* own);
  // kRecord: drops the points of the row libjpeg stopped in, and sets the index's rows (0 when
  // it could not be recorded).
  void end_recording();

  // libjpeg calls through `head` (cinfo->entropy points at it): it must come first.
  EntropyDecoderHead head{};
  // Set by the install functions and when it hands a scan back to libjpeg; the caller clears both.
  bool installed = false, bailed = false;
  Mode mode = Mode::kRestart;
  BitReader reader{};
  int restarts_to_go = 0;
  int next_restart = 0;
  int blocks = 0;
  int components = 0;
  int last_dc[MAX_COMPS_IN_SCAN] = {};
  struct Block {
    const HuffmanTable* dc;
    const HuffmanTable* ac;
    int component;  // index in the scan
  } block[D_MAX_BLOCKS_IN_MCU] = {};
  HuffmanTable dc_tables[NUM_HUFF_TBLS], ac_tables[NUM_HUFF_TBLS];

  // kRecord and kSeek: the MCU about to be decoded, in the scan libjpeg decodes.
  int mcu_col = 0, mcu_row = 0, row_mcus = 0, scan_rows = 0;
  const uint8_t* entropy = nullptr;  // the indexed scan's data
  ScanIndex* recording = nullptr;    // kRecord; null once it cannot be recorded
  int next_point = 0;                // kRecord: the MCU column of the next point
  const ScanIndex* index = nullptr;  // kSeek
  int first_point = 0, first_row = 0;

 private:
  bool prepare(j_decompress_ptr cinfo);
  // Records `index` down to `rows`, from its last recorded row.
  bool record_further(j_decompress_ptr cinfo, ScanIndex& index, int rows);
};

}  // namespace stoker::decode::detail
