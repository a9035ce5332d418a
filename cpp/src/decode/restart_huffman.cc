#include "decode/detail/restart_huffman.h"

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

boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  RestartHuffmanDecoder& d = state(cinfo);
  BitReader r = d.reader;
  if (d.restarts_to_go == 0) read_restart(cinfo, d, r);
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
  --d.restarts_to_go;
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

bool RestartHuffmanDecoder::install(j_decompress_ptr cinfo) {
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->restart_interval == 0 ||
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
  installed = true;
  head.start_pass = start_pass;
  head.decode_mcu = decode_mcu;
  head.insufficient_data = FALSE;
  cinfo->entropy = reinterpret_cast<jpeg_entropy_decoder*>(&head);
  return true;
}

}  // namespace stoker::decode::detail
