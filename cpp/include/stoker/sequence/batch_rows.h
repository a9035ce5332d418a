// A packed batch written from the plan's pieces: each row's pieces one after another from column
// 0 (their tokens read from the stream's shards, widened to int64), then padding; the labels in
// Hugging Face's convention (the token, or -100 at each piece's first token, where its
// document's loss mask is off, and on padding), position ids from 0 in each piece (and in the
// padding), each token's piece index in its row, and the cumulative segment lengths of the
// flattened batch. Flattened, the rows' real tokens are one row with no padding.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stoker/io/shard_file.h"

namespace stoker::sequence {

enum class TokenType : uint8_t { kUInt16, kUInt32, kInt32 };

// The pack's token files, one after another: shard s holds stream positions [starts[s],
// starts[s + 1]). Each is read from its mapping (io::ShardFile): a file truncated under the
// loader is an Error(kIO) naming it, never a SIGBUS. A shard no piece reads may be null.
struct TokenStream {
  std::vector<std::shared_ptr<const io::ShardFile>> shards;
  std::vector<int64_t> starts;  // shards.size() + 1
  TokenType type = TokenType::kUInt16;
};

// The document index (documents.npz): each document's first token in the stream, and the
// [start, end) spans within it where the loss mask is off (document d's are rows span_ptr[d] to
// span_ptr[d + 1] of spans, two int64 each).
struct Documents {
  std::span<const int64_t> offset;
  std::span<const int64_t> span_ptr;
  std::span<const int64_t> spans;
};

// The plan's pieces in row order: row r holds pieces row_ptr[r] .. row_ptr[r + 1].
struct Pieces {
  std::span<const int64_t> row_ptr;
  std::span<const int64_t> doc, start, length;
};

struct RowsOut {
  int64_t* input_ids;  // rows x width
  int64_t* labels;
  int64_t* position_ids;
  int32_t* seq_idx;
  int32_t* cu_seqlens;  // at least segments + 1 (pieces + rows + 1 is always enough)
  int64_t width;        // tokens per row (flattened: the batch's real tokens)
};

struct RowsOptions {
  int64_t pad_id = 0;
  bool flatten = false;       // one row of the real tokens, no padding segments
  bool shift_labels = false;  // labels[t] = the aligned label of t + 1, -100 at a row's end
};

struct RowsMade {
  int64_t loss_tokens = 0;  // labels that are not -100
  int64_t segments = 0;     // entries of cu_seqlens after its leading 0
  int64_t max_segment = 0;
};

// Writes the batch of `rows` (plan row ids; -1 is a row of padding only). Throws
// Error(kInvalidArgument) for a piece outside the stream or a row longer than `width`, and
// Error(kCorruptData) for a shard that is needed and null.
RowsMade fill_rows(const TokenStream& stream, const Documents& documents, const Pieces& pieces,
                   std::span<const int64_t> rows, const RowsOut& out, const RowsOptions& options);

}  // namespace stoker::sequence
