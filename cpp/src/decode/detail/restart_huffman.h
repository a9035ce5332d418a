// A baseline Huffman decoder for scans with restart markers, put in place of libjpeg-turbo's own
// for the crops that the restart cut (restart_roi.h) hands libjpeg. libjpeg-turbo 2.1 decodes any
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
  // Replaces libjpeg's entropy decoder for the scan just started (call right after
  // jpeg_start_decompress, before any row is read) when it is one this decodes: sequential
  // Huffman, all components in one scan, a restart interval, every component needed, the data in
  // memory. Returns whether it did.
  bool install(j_decompress_ptr cinfo);

  // libjpeg calls through `head` (cinfo->entropy points at it): it must come first.
  EntropyDecoderHead head{};
  // Set by install() and when it hands a scan back to libjpeg; the caller clears both.
  bool installed = false, bailed = false;
  BitReader reader{};
  int restarts_to_go = 0;
  int next_restart = 0;
  int blocks = 0;
  int last_dc[MAX_COMPS_IN_SCAN] = {};
  struct Block {
    const HuffmanTable* dc;
    const HuffmanTable* ac;
    int component;  // index in the scan
  } block[D_MAX_BLOCKS_IN_MCU] = {};
  HuffmanTable dc_tables[NUM_HUFF_TBLS], ac_tables[NUM_HUFF_TBLS];
};

}  // namespace stoker::decode::detail
