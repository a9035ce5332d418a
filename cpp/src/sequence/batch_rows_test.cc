#include "stoker/sequence/batch_rows.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "stoker/core/error.h"

namespace stoker::sequence {
namespace {

// A stream of 20 tokens 100..119 in two shards (12 + 8): document 0 is tokens 0-4, document 1
// tokens 5-14 (across the shards' boundary), document 2 tokens 15-19. Document 1's loss mask is
// off on its tokens 2-3.
// The shards as files (the stream reads them through io::ShardFile's mapping).
std::shared_ptr<const io::ShardFile> file_of(const std::vector<uint16_t>& tokens,
                                             const std::string& name) {
  const std::string path = ::testing::TempDir() + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(tokens.data(), 2, tokens.size(), f);
  std::fclose(f);
  return std::make_shared<const io::ShardFile>(path, /*mapped=*/true);
}

struct Fixture {
  std::vector<uint16_t> a, b;
  TokenStream stream;
  std::vector<int64_t> offset{0, 5, 15}, span_ptr{0, 0, 1, 1}, spans{2, 4};
  // Row 0: document 1 whole, then document 0's first 3 tokens (a piece); row 1: document 2.
  std::vector<int64_t> row_ptr{0, 2, 3}, doc{1, 0, 2}, start{0, 0, 0}, length{10, 3, 5};

  Fixture() {
    for (int i = 0; i < 20; ++i) (i < 12 ? a : b).push_back(static_cast<uint16_t>(100 + i));
    stream.shards = {file_of(a, "batch_rows_a.bin"), file_of(b, "batch_rows_b.bin")};
    stream.starts = {0, 12, 20};
  }
  Documents documents() const { return {offset, span_ptr, spans}; }
  Pieces pieces() const { return {row_ptr, doc, start, length}; }
};

struct Out {
  std::vector<int64_t> ids, labels, pos;
  std::vector<int32_t> seq, cu;
  explicit Out(size_t n) : ids(n), labels(n), pos(n), seq(n), cu(16) {}
  RowsOut rows(int64_t width) {
    return {ids.data(), labels.data(), pos.data(), seq.data(), cu.data(), width};
  }
};

TEST(BatchRows, RowsHoldTheirPiecesThenPadding) {
  Fixture f;
  Out o(3 * 16);
  const std::vector<int64_t> rows{0, 1, -1};
  const RowsMade made = fill_rows(f.stream, f.documents(), f.pieces(), rows, o.rows(16), {7});
  std::vector<int64_t> want_ids(48, 7), want_labels(48, -100), want_pos(48);
  std::vector<int32_t> want_seq(48);
  for (int t = 0; t < 10; ++t) want_ids[t] = 105 + t, want_pos[t] = t;           // document 1
  for (int t = 0; t < 3; ++t) want_ids[10 + t] = 100 + t, want_pos[10 + t] = t;  // document 0
  for (int t = 0; t < 5; ++t) want_ids[16 + t] = 115 + t, want_pos[16 + t] = t;  // document 2
  for (int t : {1, 4, 5, 6, 7, 8, 9, 11, 12, 17, 18, 19, 20}) want_labels[t] = want_ids[t];
  for (int t = 13; t < 16; ++t) want_pos[t] = t - 13, want_seq[t] = 2;  // row 0's padding
  for (int t = 10; t < 13; ++t) want_seq[t] = 1;
  for (int t = 21; t < 32; ++t) want_pos[t] = t - 21, want_seq[t] = 1;  // row 1's padding
  for (int t = 32; t < 48; ++t) want_pos[t] = t - 32;                   // a padding row
  EXPECT_EQ(o.ids, want_ids);
  EXPECT_EQ(o.labels, want_labels);
  EXPECT_EQ(o.pos, want_pos);
  EXPECT_EQ(o.seq, want_seq);
  EXPECT_EQ(made.segments, 6);
  EXPECT_EQ(std::vector<int32_t>(o.cu.begin(), o.cu.begin() + 7),
            (std::vector<int32_t>{0, 10, 13, 16, 21, 32, 48}));
  EXPECT_EQ(made.max_segment, 16);
  EXPECT_EQ(made.loss_tokens, 13);
}

TEST(BatchRows, FlattenedAndShiftedLabels) {
  Fixture f;
  Out o(18);
  const std::vector<int64_t> rows{1, 0};
  const RowsMade made = fill_rows(f.stream, f.documents(), f.pieces(), rows, o.rows(18),
                                  {0, /*flatten=*/true, /*shift_labels=*/true});
  // Document 2, then row 0's document 1 and document 0's piece: no padding anywhere.
  std::vector<int64_t> ids{115, 116, 117, 118, 119};
  for (int t = 0; t < 10; ++t) ids.push_back(105 + t);
  for (int t = 0; t < 3; ++t) ids.push_back(100 + t);
  EXPECT_EQ(o.ids, ids);
  // Aligned: -100 at 0, 5, 7, 8 (document 1's span), 15; shifted one to the left.
  std::vector<int64_t> aligned = ids;
  for (int t : {0, 5, 7, 8, 15}) aligned[t] = -100;
  std::vector<int64_t> shifted(aligned.begin() + 1, aligned.end());
  shifted.push_back(-100);
  EXPECT_EQ(o.labels, shifted);
  EXPECT_EQ(std::vector<int32_t>(o.seq.begin(), o.seq.begin() + 6),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(o.seq[17], 2);
  EXPECT_EQ(made.segments, 3);
  EXPECT_EQ(std::vector<int32_t>(o.cu.begin(), o.cu.begin() + 4),
            (std::vector<int32_t>{0, 5, 15, 18}));
  EXPECT_EQ(made.loss_tokens, 13);
}

TEST(BatchRows, AFileTruncatedUnderTheLoaderIsAnErrorNamingIt) {
  Fixture f;
  const std::string path = ::testing::TempDir() + "batch_rows_cut.bin";
  f.stream.shards[1] = file_of(f.b, "batch_rows_cut.bin");
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);  // mapped pages past the end now raise SIGBUS
  Out o(16);
  const std::vector<int64_t> row{1};  // document 2: tokens 15-19, in the cut shard
  try {
    fill_rows(f.stream, f.documents(), f.pieces(), row, o.rows(16), {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find("batch_rows_cut.bin"), std::string::npos) << e.what();
  }
}

TEST(BatchRows, RefusesWhatDoesNotFit) {
  Fixture f;
  Out o(2 * 8);
  const std::vector<int64_t> rows{0, 1};  // row 0 holds 13 tokens: more than a width of 8
  EXPECT_THROW(fill_rows(f.stream, f.documents(), f.pieces(), rows, o.rows(8), {}), Error);
  f.stream.shards[1] = nullptr;  // document 1 runs into a shard that is not there
  Out wide(2 * 16);
  EXPECT_THROW(fill_rows(f.stream, f.documents(), f.pieces(), rows, wide.rows(16), {}), Error);
  f.offset[2] = 18;  // document 2 past the stream's end
  f.stream.shards[1] = file_of(f.b, "batch_rows_b.bin");
  const std::vector<int64_t> last{1};
  Out one(16);
  EXPECT_THROW(fill_rows(f.stream, f.documents(), f.pieces(), last, one.rows(16), {}), Error);
  const std::vector<int64_t> missing{5};
  EXPECT_THROW(fill_rows(f.stream, f.documents(), f.pieces(), missing, one.rows(16), {}), Error);
}

}  // namespace
}  // namespace stoker::sequence
