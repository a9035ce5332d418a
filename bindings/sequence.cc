// Packing for TokenLoader(packing="best_fit" | "first_fit") (stoker/sequence): the plan's rows,
// and the batch written from them.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "stoker/core/error.h"
#include "stoker/io/shard_file.h"
#include "stoker/sequence/batch_rows.h"
#include "stoker/sequence/row_packing.h"

namespace nb = nanobind;

namespace stoker::bindings {

namespace {

using I64 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Out64 = nb::ndarray<int64_t, nb::c_contig, nb::device::cpu>;
using Out32 = nb::ndarray<int32_t, nb::c_contig, nb::device::cpu>;

std::span<const int64_t> view(const I64& a) { return {a.data(), a.shape(0)}; }

// A token pack's stream for fill_rows: each shard's file, opened (and mapped) as Python names it
// (None once it is dropped). A fill holds the files it reads for its whole run.
class TokenRows {
 public:
  TokenRows(I64 starts, const std::string& dtype) {
    STOKER_CHECK(starts.shape(0) >= 1, ErrorCode::kInvalidArgument, "no shard starts");
    stream_.starts.assign(starts.data(), starts.data() + starts.shape(0));
    stream_.shards.assign(starts.shape(0) - 1, nullptr);
    if (dtype == "uint16")
      stream_.type = sequence::TokenType::kUInt16, itemsize_ = 2;
    else if (dtype == "uint32")
      stream_.type = sequence::TokenType::kUInt32, itemsize_ = 4;
    else if (dtype == "int32")
      stream_.type = sequence::TokenType::kInt32, itemsize_ = 4;
    else
      throw_error(ErrorCode::kInvalidArgument, "tokens are uint16, uint32 or int32, not " + dtype);
  }

  void set_shard(size_t s, std::optional<std::string> path) {
    STOKER_CHECK(s < stream_.shards.size(), ErrorCode::kInvalidArgument, "no such shard");
    if (!path) {
      stream_.shards[s] = nullptr;
      return;
    }
    auto file = std::make_shared<const io::ShardFile>(*path, /*mapped=*/true);
    const int64_t tokens = stream_.starts[s + 1] - stream_.starts[s];
    if (static_cast<int64_t>(file->size()) != tokens * itemsize_)
      throw Error(ErrorCode::kCorruptData,
                  std::to_string(file->size()) + " bytes, not the " + std::to_string(tokens) +
                      " tokens the manifest gives",
                  *path);
    stream_.shards[s] = std::move(file);
  }

  std::tuple<int64_t, int64_t, int64_t> fill(I64 offset, I64 span_ptr, I64 spans, I64 row_ptr,
                                             I64 doc, I64 start, I64 length, I64 rows,
                                             Out64 input_ids, Out64 labels, Out64 position_ids,
                                             Out32 seq_idx, Out32 cu_seqlens, int64_t width,
                                             int64_t pad_id, bool flatten, bool shift_labels) {
    const size_t cells = input_ids.size();
    STOKER_CHECK(labels.size() == cells && position_ids.size() == cells && seq_idx.size() == cells,
                 ErrorCode::kInvalidArgument, "the outputs' sizes differ");
    const size_t row_count = flatten ? 1 : rows.shape(0);
    STOKER_CHECK(cells == row_count * static_cast<size_t>(width), ErrorCode::kInvalidArgument,
                 "the outputs hold " + std::to_string(cells) + " tokens, not rows x width");
    STOKER_CHECK(span_ptr.shape(0) == offset.shape(0) + 1 && spans.shape(0) % 2 == 0,
                 ErrorCode::kInvalidArgument, "a document index of mismatched arrays");
    STOKER_CHECK(
        row_ptr.shape(0) >= 1 && start.shape(0) == doc.shape(0) && length.shape(0) == doc.shape(0),
        ErrorCode::kInvalidArgument, "a plan of mismatched arrays");
    // The shards this fill reads (and only those), held while the GIL is released.
    sequence::TokenStream stream;
    stream.starts = stream_.starts;
    stream.type = stream_.type;
    stream.shards.assign(stream_.shards.size(), nullptr);
    size_t segments = rows.shape(0);  // at most a padding segment a row, and the pieces
    const auto& starts = stream_.starts;
    const int64_t num_rows = static_cast<int64_t>(row_ptr.shape(0)) - 1;
    auto shard_at = [&](int64_t pos) {
      return std::upper_bound(starts.begin(), starts.end(), pos) - starts.begin() - 1;
    };
    for (size_t i = 0; i < rows.shape(0); ++i) {
      const int64_t r = rows.data()[i];
      if (r < 0 || r >= num_rows) continue;  // fill_rows says what is wrong with it
      for (int64_t p = row_ptr.data()[r]; p < row_ptr.data()[r + 1]; ++p) {
        segments += 1;
        const int64_t d = doc.data()[p];
        if (d < 0 || d >= static_cast<int64_t>(offset.shape(0))) continue;
        const int64_t first = offset.data()[d] + start.data()[p];
        const int64_t last = first + std::max<int64_t>(length.data()[p], 1) - 1;
        const int64_t end = std::min<int64_t>(shard_at(last), stream.shards.size() - 1);
        for (int64_t s = std::max<int64_t>(shard_at(first), 0); s <= end; ++s)
          stream.shards[s] = stream_.shards[s];
      }
    }
    STOKER_CHECK(cu_seqlens.size() >= segments + 1, ErrorCode::kInvalidArgument,
                 "cu_seqlens holds " + std::to_string(cu_seqlens.size()) + ", not " +
                     std::to_string(segments + 1));
    const sequence::Documents documents{
        view(offset), view(span_ptr), {spans.data(), spans.shape(0)}};
    const sequence::Pieces pieces{view(row_ptr), view(doc), view(start), view(length)};
    const sequence::RowsOut out{input_ids.data(), labels.data(),     position_ids.data(),
                                seq_idx.data(),   cu_seqlens.data(), width};
    sequence::RowsMade made;
    {
      nb::gil_scoped_release release;
      made = sequence::fill_rows(stream, documents, pieces, view(rows), out,
                                 {pad_id, flatten, shift_labels});
    }
    return {made.loss_tokens, made.segments, made.max_segment};
  }

 private:
  sequence::TokenStream stream_;
  int64_t itemsize_ = 2;
};

}  // namespace

void register_sequence(nb::module_& m) {
  using Rows = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  m.def(
      "pack_rows",
      [](I64 lengths, Rows row_of, Rows slot_of, int64_t capacity, int64_t max_segments,
         int64_t window, const std::string& fit) {
        STOKER_CHECK(fit == "best_fit" || fit == "first_fit", ErrorCode::kInvalidArgument,
                     "fit is 'best_fit' or 'first_fit', not '" + fit + "'");
        const sequence::RowPacking options{
            capacity, max_segments, window,
            fit == "best_fit" ? sequence::Fit::kBest : sequence::Fit::kFirst};
        std::span<int64_t> rows(row_of.data(), row_of.shape(0));
        std::span<int64_t> slots(slot_of.data(), slot_of.shape(0));
        nb::gil_scoped_release release;
        return sequence::pack_rows(view(lengths), options, rows, slots);
      },
      nb::arg("lengths"), nb::arg("row_of"), nb::arg("slot_of"), nb::arg("capacity"),
      nb::arg("max_segments"), nb::arg("window"), nb::arg("fit"),
      "Writes each piece's row into row_of and its place in the row into slot_of (int64, one "
      "per piece) and returns the number of rows: pieces taken `window` at a time, each window "
      "in decreasing length, into the tightest open row (best_fit) or the first (first_fit) of "
      "`capacity` tokens and at most `max_segments` pieces (0: no bound).");

  nb::class_<TokenRows>(m, "TokenRows",
                        "A token pack's stream (its shards' arrays, set as they are mapped) and "
                        "the packed batches written from it.")
      .def(nb::init<I64, const std::string&>(), nb::arg("starts"), nb::arg("dtype"))
      .def("set_shard", &TokenRows::set_shard, nb::arg("shard"), nb::arg("path").none(),
           "Opens shard `shard`'s token file at `path` (checked against its token count), or "
           "drops it (None).")
      .def("fill", &TokenRows::fill, nb::arg("offset"), nb::arg("span_ptr"), nb::arg("spans"),
           nb::arg("row_ptr"), nb::arg("doc"), nb::arg("start"), nb::arg("length"), nb::arg("rows"),
           nb::arg("input_ids"), nb::arg("labels"), nb::arg("position_ids"), nb::arg("seq_idx"),
           nb::arg("cu_seqlens"), nb::arg("width"), nb::arg("pad_id"), nb::arg("flatten"),
           nb::arg("shift_labels"),
           "Writes the batch of plan `rows` (-1: padding) into the outputs; returns (loss "
           "tokens, segments, longest segment). The GIL is released while it writes.");
}

}  // namespace stoker::bindings
