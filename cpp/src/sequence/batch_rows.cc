#include "stoker/sequence/batch_rows.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "stoker/core/error.h"

namespace stoker::sequence {

namespace {

int64_t item_size(TokenType type) { return type == TokenType::kUInt16 ? 2 : 4; }

// `to[0 .. n)` from n tokens of T stored at the end of the same buffer: forward, each token's
// bytes read before its int64 is written (element i's bytes start at or after byte 8 * i).
template <typename T>
void widen_in_place(int64_t* to, int64_t n) {
  const auto* raw = reinterpret_cast<const uint8_t*>(to) + n * (8 - int64_t{sizeof(T)});
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, raw + i * int64_t{sizeof(T)}, sizeof(T));
    to[i] = static_cast<int64_t>(v);
  }
}

// Stream positions [at, at + n) into `to`, across shard ends.
void read_stream(const TokenStream& stream, int64_t at, int64_t n, int64_t* to) {
  const auto& starts = stream.starts;
  STOKER_CHECK(at >= 0 && n >= 0 && at + n <= starts.back(), ErrorCode::kInvalidArgument,
               "tokens " + std::to_string(at) + " + " + std::to_string(n) +
                   " past the stream's end (" + std::to_string(starts.back()) + ")");
  const int64_t item = item_size(stream.type);
  while (n > 0) {
    const size_t s =
        static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), at) - starts.begin()) -
        1;
    const int64_t take = std::min(n, starts[s + 1] - at);
    const auto& shard = stream.shards[s];
    STOKER_CHECK(shard != nullptr, ErrorCode::kCorruptData,
                 "token file " + std::to_string(s) + " is needed and not open");
    // The raw tokens into the end of their int64 slots, then widened where they are.
    auto* raw = reinterpret_cast<uint8_t*>(to) + take * (8 - item);
    shard->read(static_cast<uint64_t>((at - starts[s]) * item), static_cast<uint64_t>(take * item),
                raw);
    switch (stream.type) {
      case TokenType::kUInt16: widen_in_place<uint16_t>(to, take); break;
      case TokenType::kUInt32: widen_in_place<uint32_t>(to, take); break;
      case TokenType::kInt32: widen_in_place<int32_t>(to, take); break;
    }
    at += take;
    n -= take;
    to += take;
  }
}

}  // namespace

RowsMade fill_rows(const TokenStream& stream, const Documents& documents, const Pieces& pieces,
                   std::span<const int64_t> rows, const RowsOut& out, const RowsOptions& options) {
  RowsMade made;
  const int64_t width = out.width;
  const int64_t num_rows = static_cast<int64_t>(pieces.row_ptr.size()) - 1;
  const int64_t num_docs = static_cast<int64_t>(documents.offset.size());
  int64_t col = 0;  // where the next token goes (flattened: across the whole batch)
  int64_t row_index = 0;
  int32_t segment = 0;  // the next piece's index in its row (flattened: in the batch)
  out.cu_seqlens[0] = 0;
  auto close_segment = [&](int64_t length) {
    made.segments += 1;
    out.cu_seqlens[made.segments] =
        static_cast<int32_t>(out.cu_seqlens[made.segments - 1] + length);
    made.max_segment = std::max(made.max_segment, length);
  };
  for (const int64_t row : rows) {
    STOKER_CHECK(row >= -1 && row < num_rows, ErrorCode::kInvalidArgument,
                 "row " + std::to_string(row) + " of a plan of " + std::to_string(num_rows));
    const int64_t row_start = options.flatten ? 0 : row_index * width;
    if (!options.flatten) {
      col = 0;
      segment = 0;
    }
    if (row >= 0) {
      for (int64_t p = pieces.row_ptr[row]; p < pieces.row_ptr[row + 1]; ++p) {
        const int64_t doc = pieces.doc[p], start = pieces.start[p], length = pieces.length[p];
        STOKER_CHECK(doc >= 0 && doc < num_docs && start >= 0 && length >= 1,
                     ErrorCode::kInvalidArgument, "a piece outside the documents");
        STOKER_CHECK(
            col + length <= width, ErrorCode::kInvalidArgument,
            "row " + std::to_string(row) + " holds more than " + std::to_string(width) + " tokens");
        const int64_t at = row_start + col;
        read_stream(stream, documents.offset[doc] + start, length, out.input_ids + at);
        std::memcpy(out.labels + at, out.input_ids + at, length * sizeof(int64_t));
        out.labels[at] = -100;  // nothing before it in its segment predicts it
        for (int64_t k = documents.span_ptr[doc]; k < documents.span_ptr[doc + 1]; ++k) {
          const int64_t lo = std::max(documents.spans[2 * k] - start, int64_t{0});
          const int64_t hi = std::min(documents.spans[2 * k + 1] - start, length);
          for (int64_t t = lo; t < hi; ++t) out.labels[at + t] = -100;
        }
        for (int64_t t = 0; t < length; ++t) {
          out.position_ids[at + t] = t;
          out.seq_idx[at + t] = segment;
        }
        close_segment(length);
        col += length;
        segment += 1;
      }
    }
    if (!options.flatten) {  // padding: a segment of its own, positions from 0, no loss
      const int64_t pad = width - col;
      for (int64_t t = 0; t < pad; ++t) {
        out.input_ids[row_start + col + t] = options.pad_id;
        out.labels[row_start + col + t] = -100;
        out.position_ids[row_start + col + t] = t;
        out.seq_idx[row_start + col + t] = segment;
      }
      if (pad > 0) close_segment(pad);
    }
    row_index += 1;
  }
  const int64_t written_rows = options.flatten ? 1 : row_index;
  const int64_t total = options.flatten ? col : row_index * width;
  if (options.flatten)
    STOKER_CHECK(
        col == width, ErrorCode::kInvalidArgument,
        "a flattened batch of " + std::to_string(col) + " tokens, not " + std::to_string(width));
  if (options.shift_labels) {
    for (int64_t r = 0; r < written_rows; ++r) {
      int64_t* l = out.labels + r * width;
      if (width > 0) {
        std::memmove(l, l + 1, (width - 1) * sizeof(int64_t));
        l[width - 1] = -100;
      }
    }
  }
  for (int64_t i = 0; i < total; ++i) made.loss_tokens += out.labels[i] != -100;
  return made;
}

}  // namespace stoker::sequence
