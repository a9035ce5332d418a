#include "decode/detail/restart_huffman.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace stoker::decode::detail {

namespace {

static_assert(std::is_standard_layout_v<RestartHuffmanDecoder>);
static_assert(offsetof(RestartHuffmanDecoder, head) == 0, "cinfo->entropy points at head");

// Natural (row-major) position of each zigzag index.
constexpr uint8_t kNaturalOrder[64] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48,
    41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23,
    30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};

RestartHuffmanDecoder& state(j_decompress_ptr cinfo) {
  return *reinterpret_cast<RestartHuffmanDecoder*>(cinfo->entropy);
}

// Hands the scan back to libjpeg: error_exit never returns (the decoder's longjmps).
[[noreturn]] void bail(j_decompress_ptr cinfo) {
  state(cinfo).bailed = true;
  (*cinfo->err->error_exit)(reinterpret_cast<j_common_ptr>(cinfo));
  std::abort();  // not reached
}

#define STOKER_INLINE [[gnu::always_inline]] inline

// Tops the buffer up to at least 32 bits: a code (16 bits at most) and its value bits (15) are
// then all there. Eight bytes at a time while none is 0xFF; then byte by byte: FF 00 is a data
// byte 0xFF, and at any other 0xFF (a marker) it adds zero bits instead, as libjpeg does,
// counting them: a decode that uses one has run out of data. The end of the data without a
// marker (a truncated file; the restart cut always ends in one) is libjpeg's to report.
STOKER_INLINE void fill(j_decompress_ptr cinfo, BitReader& r) {
  if (r.count >= 32) return;
  if (!r.at_marker && r.end - r.next >= 8) {
    uint64_t word;
    std::memcpy(&word, r.next, 8);
    if constexpr (std::endian::native == std::endian::little) word = __builtin_bswap64(word);
    const uint64_t inverted = ~word;
    if (((inverted - 0x0101010101010101ull) & ~inverted & 0x8080808080808080ull) == 0) {
      const int bytes = (64 - r.count) >> 3;  // 4 to 8
      const int taken = bytes * 8;
      const uint64_t top = taken == 64 ? word : word >> (64 - taken);
      r.bits |= top << (64 - r.count - taken);
      r.count += taken;
      r.next += bytes;
      return;
    }
  }
  while (r.count <= 56) {
    uint64_t byte = 0;
    if (!r.at_marker) {
      if (r.next < r.end && *r.next != 0xFF) {
        byte = *r.next++;
      } else if (r.end - r.next < 2) {
        bail(cinfo);  // libjpeg's source warns "premature end" when it reads ahead to here
      } else if (r.next[1] == 0x00) {
        byte = 0xFF;
        r.next += 2;
      } else {
        r.at_marker = true;
      }
    }
    if (r.at_marker) r.zero_bits += 8;
    r.bits |= byte << (56 - r.count);
    r.count += 8;
  }
}

STOKER_INLINE int take_bits(BitReader& r, int n) {  // 1 <= n <= 16, with n bits buffered
  const auto v = static_cast<int>(r.bits >> (64 - n));
  r.bits <<= n;
  r.count -= n;
  return v;
}

// Figure F.12: an n-bit value below 2^(n-1) stands for a negative one. Without a branch: the
// sign of a coefficient is a coin toss for the branch predictor.
STOKER_INLINE int extend(int v, int n) {
  const int negative = (v - (1 << (n - 1))) >> 31;  // all ones or zero (C++20: arithmetic)
  return v + (negative & static_cast<int>((~0u << n) + 1));
}

STOKER_INLINE int decode_symbol(j_decompress_ptr cinfo, BitReader& r, const HuffmanTable& t) {
  fill(cinfo, r);
  const unsigned entry = t.fast[r.bits >> (64 - HuffmanTable::kLookahead)];
  if (entry != 0) [[likely]] {
    const int length = static_cast<int>(entry >> 8);
    r.bits <<= length;
    r.count -= length;
    return static_cast<int>(entry & 0xFF);
  }
  int length = HuffmanTable::kLookahead + 1;
  auto code = static_cast<int32_t>(r.bits >> (64 - length));
  while (code > t.max_code[length]) {
    if (++length > 16) bail(cinfo);  // no such code: libjpeg warns and makes it a zero
    code = static_cast<int32_t>(r.bits >> (64 - length));
  }
  r.bits <<= length;
  r.count -= length;
  return t.values[code + t.value_offset[length]];
}

// Section F.2.2.4 and libjpeg's process_restart: the interval's last byte held its padding only,
// and the marker is the next one in sequence. Otherwise libjpeg would warn or resynchronise.
void read_restart(j_decompress_ptr cinfo, RestartHuffmanDecoder& d, BitReader& r) {
  // Under 8 bits of data left, fill reaches the marker (it never reads past an 0xFF that is not
  // FF 00); 8 or more (buffered or not) are bytes libjpeg would discard with a warning.
  fill(cinfo, r);
  if (!r.at_marker || r.count - r.zero_bits >= 8) bail(cinfo);
  while (r.next < r.end && *r.next == 0xFF) ++r.next;  // the marker's 0xFF, and fill bytes
  if (r.next >= r.end || *r.next != 0xD0 + d.next_restart) bail(cinfo);
  ++r.next;
  d.next_restart = (d.next_restart + 1) & 7;
  r = {r.next, r.end, 0, 0, 0, false};
  std::memset(d.last_dc, 0, sizeof d.last_dc);
  d.restarts_to_go = static_cast<int>(cinfo->restart_interval);
}

// The position of the next bit in the file's bytes: the buffered bits that are data (not zeros
// past a marker) came from the last whole bytes before `next`, each 0xFF of them as FF 00.
uint64_t bit_position(const BitReader& r, const uint8_t* entropy) {
  const int data_bits = r.count - r.zero_bits;
  const int bytes_back = (data_bits + 7) / 8;
  const uint8_t* p = r.next;
  for (int i = 0; i < bytes_back; ++i)
    p -= (p - entropy >= 2 && p[-1] == 0x00 && p[-2] == 0xFF) ? 2 : 1;
  return static_cast<uint64_t>(p - entropy) * 8 + static_cast<uint64_t>(bytes_back * 8 - data_bits);
}

void record_point(RestartHuffmanDecoder& d, const BitReader& r) {
  ScanIndex& index = *d.recording;
  const uint64_t bits = bit_position(r, d.entropy);
  if (bits > UINT32_MAX) {  // a scan over 512 MiB: decoded, not indexed
    d.recording = nullptr;
    return;
  }
  index.bits.push_back(static_cast<uint32_t>(bits));
  for (int c = 0; c < d.components; ++c)
    index.dc.push_back(static_cast<int16_t>(d.last_dc[c]));  // in range: decode_mcu checks
  d.next_point += index.step;
}

// Enters the scan at one of the index's points: the reader at its bit, the DC predictors its.
void enter(j_decompress_ptr cinfo, RestartHuffmanDecoder& d, BitReader& r, const ScanIndex& index,
           size_t point) {
  const uint32_t bits = index.bits[point];
  if ((bits >> 3) >= static_cast<size_t>(r.end - d.entropy)) bail(cinfo);
  r = {d.entropy + (bits >> 3), r.end, 0, 0, 0, false};
  if (bits & 7) {
    fill(cinfo, r);
    take_bits(r, static_cast<int>(bits & 7));
  }
  for (int c = 0; c < d.components; ++c)
    d.last_dc[c] = index.dc[point * static_cast<size_t>(d.components) + c];
}

// Enters the scan at the point that starts this row of the crop.
void seek_row(j_decompress_ptr cinfo, RestartHuffmanDecoder& d, BitReader& r) {
  const ScanIndex& index = *d.index;
  if (d.mcu_row >= d.scan_rows) bail(cinfo);  // more rows than the cut has: not libjpeg's way
  enter(cinfo, d, r, index,
        static_cast<size_t>(d.first_row + d.mcu_row) * index.points_per_row() + d.first_point);
}

boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  RestartHuffmanDecoder& d = state(cinfo);
  BitReader r = d.reader;
  switch (d.mode) {
    case RestartHuffmanDecoder::Mode::kRestart:
      if (d.restarts_to_go == 0) read_restart(cinfo, d, r);
      break;
    case RestartHuffmanDecoder::Mode::kRecord:
      if (d.mcu_col == d.next_point && d.recording) record_point(d, r);
      break;
    case RestartHuffmanDecoder::Mode::kSeek:
      if (d.mcu_col == 0) seek_row(cinfo, d, r);
      break;
  }
  for (int b = 0; b < d.blocks; ++b) {
    JCOEF* coef = MCU_data ? MCU_data[b][0] : nullptr;  // null: libjpeg skipping rows
    const RestartHuffmanDecoder::Block& block = d.block[b];
    int s = decode_symbol(cinfo, r, *block.dc);
    if (s > 15) bail(cinfo);  // libjpeg refuses such DC tables; never reached
    const int diff = s ? extend(take_bits(r, s), s) : 0;
    const int dc = d.last_dc[block.component] + diff;
    // libjpeg keeps an int and stores a JCOEF: a value it would truncate is no real image's.
    if (dc < -32768 || dc > 32767) bail(cinfo);
    d.last_dc[block.component] = dc;
    if (coef) coef[0] = static_cast<JCOEF>(dc);
    const HuffmanTable& ac = *block.ac;
    for (int k = 1; k < 64; ++k) {
      const int symbol = decode_symbol(cinfo, r, ac);
      const int run = symbol >> 4;
      s = symbol & 15;
      if (s) {
        k += run;
        if (k > 63) bail(cinfo);  // past the block: libjpeg writes it to the last coefficient
        const int value = extend(take_bits(r, s), s);
        if (coef) coef[kNaturalOrder[k]] = static_cast<JCOEF>(value);
      } else {
        if (run != 15) break;  // end of block
        k += 15;
      }
    }
  }
  if (r.zero_bits > r.count) bail(cinfo);  // it used bits past a marker: out of data
  if (d.mode == RestartHuffmanDecoder::Mode::kRestart) {
    --d.restarts_to_go;
  } else if (++d.mcu_col == d.row_mcus) {
    d.mcu_col = d.next_point = 0;
    ++d.mcu_row;
  }
  d.reader = r;
  return TRUE;
}

#undef STOKER_INLINE

void start_pass(j_decompress_ptr cinfo) { bail(cinfo); }  // a second scan: not a baseline file

}  // namespace

bool HuffmanTable::build(const JHUFF_TBL& table) {
  std::memset(fast, 0, sizeof fast);
  int count = 0, code = 0;
  for (int length = 1; length <= 16; ++length) {
    const int n = table.bits[length];
    if (count + n > 256) return false;
    // The codes of a length must fit it, all ones excepted (jdhuff.c: "bad Huffman table"):
    // checked before they index `fast`.
    if (n > 0 && code + n >= (1 << length)) return false;
    value_offset[length] = count - code;
    for (int i = 0; i < n; ++i, ++code, ++count) {
      if (length <= kLookahead) {
        const int shift = kLookahead - length;
        const auto entry = static_cast<uint16_t>((length << 8) | table.huffval[count]);
        for (int j = code << shift; j < (code + 1) << shift; ++j) fast[j] = entry;
      }
    }
    max_code[length] = n ? code - 1 : -1;
    code <<= 1;
  }
  std::memcpy(values, table.huffval, sizeof values);
  return true;
}

bool RestartHuffmanDecoder::prepare(j_decompress_ptr cinfo) {
  if (cinfo->progressive_mode || cinfo->arith_code ||
      cinfo->comps_in_scan != cinfo->num_components || cinfo->input_iMCU_row != 0 ||
      cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU || cinfo->src == nullptr ||
      cinfo->unread_marker != 0 || cinfo->Ss != 0 || cinfo->Se != 63 || cinfo->Ah != 0 ||
      cinfo->Al != 0)
    return false;
  bool dc_built[NUM_HUFF_TBLS] = {}, ac_built[NUM_HUFF_TBLS] = {};
  for (int ci = 0; ci < cinfo->comps_in_scan; ++ci) {
    const jpeg_component_info* comp = cinfo->cur_comp_info[ci];
    if (!comp->component_needed) return false;
    const int dc = comp->dc_tbl_no, ac = comp->ac_tbl_no;
    if (dc < 0 || dc >= NUM_HUFF_TBLS || ac < 0 || ac >= NUM_HUFF_TBLS ||
        !cinfo->dc_huff_tbl_ptrs[dc] || !cinfo->ac_huff_tbl_ptrs[ac])
      return false;
    if (!dc_built[dc] && !dc_tables[dc].build(*cinfo->dc_huff_tbl_ptrs[dc])) return false;
    if (!ac_built[ac] && !ac_tables[ac].build(*cinfo->ac_huff_tbl_ptrs[ac])) return false;
    dc_built[dc] = ac_built[ac] = true;
  }
  blocks = cinfo->blocks_in_MCU;
  components = cinfo->comps_in_scan;
  for (int b = 0; b < blocks; ++b) {
    const int ci = cinfo->MCU_membership[b];
    const jpeg_component_info* comp = cinfo->cur_comp_info[ci];
    block[b] = {&dc_tables[comp->dc_tbl_no], &ac_tables[comp->ac_tbl_no], ci};
  }
  const uint8_t* data = cinfo->src->next_input_byte;
  reader = {data, data + cinfo->src->bytes_in_buffer, 0, 0, 0, false};
  restarts_to_go = static_cast<int>(cinfo->restart_interval);
  next_restart = 0;
  std::memset(last_dc, 0, sizeof last_dc);
  mcu_col = mcu_row = next_point = 0;
  row_mcus = static_cast<int>(cinfo->MCUs_per_row);
  scan_rows = static_cast<int>(cinfo->MCU_rows_in_scan);
  recording = nullptr;
  index = nullptr;
  head.start_pass = start_pass;
  head.decode_mcu = decode_mcu;
  head.insufficient_data = FALSE;
  return true;
}

bool RestartHuffmanDecoder::install(j_decompress_ptr cinfo) {
  if (cinfo->restart_interval == 0 || !prepare(cinfo)) return false;
  mode = Mode::kRestart;
  installed = true;
  cinfo->entropy = reinterpret_cast<jpeg_entropy_decoder*>(&head);
  return true;
}

bool RestartHuffmanDecoder::install_recording(j_decompress_ptr cinfo, const uint8_t* scan,
                                              ScanIndex& out) {
  if (cinfo->restart_interval != 0 || !prepare(cinfo) || cinfo->src->next_input_byte != scan)
    return false;
  mode = Mode::kRecord;
  entropy = scan;
  out.mcus_per_row = row_mcus;
  out.mcu_rows = scan_rows;
  // About 16 points a row: a crop's columns are cut to within a 16th of the image's width.
  out.step = std::max(1, (row_mcus + 15) / 16);
  out.components = components;
  out.rows = 0;
  out.max_rows = scan_rows;
  out.bits.clear();
  out.dc.clear();
  // Here, not in decode_mcu: an allocation failure must not unwind through libjpeg's frames.
  out.bits.reserve(static_cast<size_t>(out.points_per_row()) * scan_rows);
  out.dc.reserve(out.bits.capacity() * static_cast<size_t>(components));
  recording = &out;
  installed = true;
  cinfo->entropy = reinterpret_cast<jpeg_entropy_decoder*>(&head);
  return true;
}

bool RestartHuffmanDecoder::install_seeking(j_decompress_ptr cinfo, const uint8_t* scan,
                                            const uint8_t* end, const ScanIndex& from, int mx0,
                                            int my0, int rows, ScanIndex* own) {
  if (cinfo->restart_interval != 0 || !prepare(cinfo) || from.step <= 0 || from.rows <= 0 ||
      mx0 < 0 || my0 < 0 || mx0 % from.step != 0 || components != from.components ||
      mx0 + row_mcus > from.mcus_per_row || rows < my0 + scan_rows || rows > from.mcu_rows ||
      from.rows > from.mcu_rows ||
      from.bits.size() != static_cast<size_t>(from.points_per_row()) * from.rows ||
      from.dc.size() != from.bits.size() * static_cast<size_t>(components) || end <= scan ||
      (rows > from.rows && own != &from))
    return false;
  installed = true;
  entropy = scan;
  reader = {scan, end, 0, 0, 0, false};
  cinfo->entropy = reinterpret_cast<jpeg_entropy_decoder*>(&head);
  const int roi_mcus = row_mcus, roi_rows = scan_rows;
  if (rows > from.rows && !record_further(cinfo, *own, rows)) return false;
  mode = Mode::kSeek;
  index = &from;
  first_point = mx0 / from.step;
  first_row = my0;
  mcu_col = mcu_row = 0;
  row_mcus = roi_mcus;
  scan_rows = roi_rows;
  return true;
}

bool RestartHuffmanDecoder::record_further(j_decompress_ptr cinfo, ScanIndex& x, int rows) {
  // From the last row's first point, its points recorded again: recording keeps whole rows.
  const int start = x.rows - 1;
  const size_t per_row = static_cast<size_t>(x.points_per_row());
  BitReader r = reader;
  enter(cinfo, *this, r, x, static_cast<size_t>(start) * per_row);
  reader = r;
  x.bits.resize(static_cast<size_t>(start) * per_row);
  x.dc.resize(x.bits.size() * static_cast<size_t>(components));
  // Here, not in decode_mcu: an allocation failure must not unwind through libjpeg's frames.
  x.bits.reserve(static_cast<size_t>(rows) * per_row);
  x.dc.reserve(x.bits.capacity() * static_cast<size_t>(components));
  mode = Mode::kRecord;
  recording = &x;
  mcu_row = start;
  mcu_col = next_point = 0;
  row_mcus = x.mcus_per_row;
  scan_rows = x.mcu_rows;
  while (recording && mcu_row < rows) decode_mcu(cinfo, nullptr);
  if (!recording) return false;
  recording = nullptr;
  x.rows = static_cast<int>(x.bits.size() / per_row);
  x.bits.shrink_to_fit();  // what ScanIndex::bytes() counts
  x.dc.shrink_to_fit();
  return x.rows >= rows;
}

void RestartHuffmanDecoder::end_recording() {
  if (mode != Mode::kRecord || !installed || !recording) return;
  const size_t per_row = static_cast<size_t>(recording->points_per_row());
  recording->rows = static_cast<int>(recording->bits.size() / per_row);
  recording->bits.resize(static_cast<size_t>(recording->rows) * per_row);
  recording->dc.resize(recording->bits.size() * static_cast<size_t>(components));
  recording->bits.shrink_to_fit();
  recording->dc.shrink_to_fit();
}

}  // namespace stoker::decode::detail
