// A dataset: an ordered list of samples spread over shards. A sample is a set of named members,
// each a byte range of one of its shard's files. Three shard layouts (docs/FORMAT.md):
//   - tar: a WebDataset tar (KEY.<member> files) and its index: a stoker pack (a folder with
//     manifest.json), a single .tar, or a folder of .tar files (indexed on open);
//   - columns: an array pack, one .npy file per field and shard, row i of each being sample i's
//     member of that name (raw elements, no header of their own);
//   - tokens: a token pack or a token file (nanoGPT's .bin, a .npy), sample w being the window of
//     seq_len + 1 tokens at token w * seq_len of its shard (windows never cross shards).
//   - row groups: Parquet files, one shard per row group, whose decoded columns a fetcher hands
//     to the gate (io::RowGroup): a sample is a row, its members the row's cells.
// Or a pack folder in a local cache whose files arrive while it is read (open_fetched: a pack in
// object storage).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/core/dtype.h"
#include "stoker/format/shard_index.h"
#include "stoker/io/shard_file.h"
#include "stoker/io/shard_gate.h"

namespace stoker::format {

inline constexpr int kPackFormatVersion = 2;  // 1 still loads: its samples are one image
inline constexpr int kArrayPackFormatVersion = 1;
inline constexpr int kTokenPackFormatVersion = 1;
inline constexpr const char* kManifestName = "manifest.json";
// Columns added to a pack without rewriting it (stoker.attach): their sidecars, listed beside the
// manifest. A sidecar has one tar shard and index per pack shard, the same samples in the same
// order, each with one member named as the sidecar; a loader reads it as one of the sample's.
inline constexpr const char* kAttachedName = "attached.json";
inline constexpr int kAttachedFormatVersion = 1;
inline constexpr size_t kMaxSidecars = 256;

enum class ShardLayout : uint8_t { kTar, kColumns, kTokens, kRowGroup };

// Where one member's bytes are. `raw` says how a raw member's bytes are laid out (an array
// pack's row, a window of tokens); null for an encoded one (a tar's file: JPEG, PNG, .npy...).
struct MemberRef {
  uint32_t file = 0;  // of the sample's shard (a tar shard has one)
  uint64_t offset = 0, size = 0;
  uint32_t crc32c = 0;  // of the bytes, where has_crc
  bool has_crc = false;
  const RawLayout* raw = nullptr;
  std::string_view name;
  ImageSize image_size;  // an image member's, where the index records it (0 x 0 otherwise)
};

// Where Dataset::image_sizes found a shard's sizes.
enum class SizeSource : uint8_t {
  kIndex,      // the index records them (version 3, or a foreign shard's index with CRCs)
  kSizesFile,  // the sizes file beside an older index (read from the images once before)
  kHeaders,    // read from the images' headers now (and kept in the sizes file where it can be)
  kLayout,     // an array pack's image column: every row has the column's shape
  kNone,       // no images (token data)
};
const char* size_source_name(SizeSource source);

// What opening a dataset needs beyond its path.
struct DatasetOptions {
  int64_t seq_len = 0;  // token data: the window's length (> 0); ignored otherwise
  // Bare token files (.bin): the element type (nanoGPT writes uint16). A token pack or a .npy
  // says its own; given, it must agree.
  std::optional<DType> token_dtype;
  // A tar pack's sidecars (attached.json): opened with it; false: the pack alone (what
  // stoker.attach reads the pack's keys from while it replaces one).
  bool sidecars = true;
};

// Immutable after open(); safe to share between threads.
class Dataset {
 public:
  static std::shared_ptr<const Dataset> open(const std::string& path,
                                             const DatasetOptions& options = {});
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;
  // Foreign WebDataset shards, in the given order.
  static std::shared_ptr<const Dataset> open_tars(const std::vector<std::string>& tar_paths);
  // Token files (nanoGPT's flat .bin, or a 1-d .npy), one shard each, in the given order.
  static std::shared_ptr<const Dataset> open_token_files(const std::vector<std::string>& paths,
                                                         const DatasetOptions& options);
  // Parquet row groups, one shard each, in the given order: `name` says where it is in messages
  // ("train-0.parquet (row group 3)"), `first_row` is its first row's in its file (a sample's
  // key is its row in the file), `columns` the members its rows have, in the order the fetcher
  // hands them over (gate()->ready_rows). `classes`: a label column's class names, if any.
  struct RowGroupInfo {
    std::string name;
    int64_t rows = 0;
    int64_t first_row = 0;
    std::vector<std::string> columns;
  };
  static std::shared_ptr<const Dataset> open_row_groups(const std::string& path,
                                                        std::vector<RowGroupInfo> row_groups,
                                                        std::vector<std::string> classes);
  // A pack folder holding manifest.json (and a tar pack's indexes), whose data files a fetcher
  // brings into the same folder while the dataset is read: each is checked against the size the
  // manifest gives, and reads wait at gate() for their file.
  static std::shared_ptr<const Dataset> open_fetched(const std::string& path,
                                                     const DatasetOptions& options = {});

  int64_t size() const { return shard_starts_.empty() ? 0 : shard_starts_.back(); }
  // The index of a shard's first sample.
  int64_t shard_first(uint32_t shard) const { return shard_starts_.at(shard); }
  size_t num_shards() const { return shards_.size(); }
  uint32_t shard_of(int64_t i) const;
  int64_t shard_samples(uint32_t shard) const {
    return shard_starts_.at(shard + 1) - shard_starts_.at(shard);
  }
  ShardLayout layout(uint32_t shard) const { return shards_.at(shard).layout; }
  // A token shard's tokens (its windows hold all but the last few); 0 for other layouts.
  int64_t shard_tokens(uint32_t shard) const;
  // Where a token shard's tokens are: its file (path), the offset of token 0, their type.
  struct TokenSource {
    std::string path;
    uint64_t offset = 0;
    DType dtype = DType::kUInt16;
  };
  TokenSource token_source(uint32_t shard) const;

  // The id of member `name` among `shard`'s (-1: no sample of the shard has it), for member();
  // a sidecar's member (attached.json) where the shard's own samples have none of that name.
  int find_member(uint32_t shard, std::string_view name) const;
  // The names of the sidecars attached to this pack (attached.json), in its order.
  std::vector<std::string> attached() const;
  // The member names a tar shard's index holds (any of its samples'), its sidecars' not
  // included; empty for other layouts.
  std::vector<std::string> member_names(uint32_t shard) const;
  // Sample i's member `id` (of find_member on its shard): false if the sample has no such member.
  bool member(int64_t i, int id, MemberRef& out) const;
  // The image size of each sample of shard `shard`: that of the first of `members` (names, in
  // order of preference) the sample has; 0 x 0 where it has none, or its size is unknown. An
  // index of version 1 or 2 (or a foreign shard opened here) records none: they are read from a
  // sizes file beside the index when a valid one is there, else from the images' first bytes
  // (probe_image_sizes), then written to that file where the folder allows (else read again by
  // the next process). A fetched dataset's shard that records none is refused (kUnsupported:
  // reading the sizes would need the whole shard here). Thread-safe; reads files.
  std::vector<ImageSize> image_sizes(uint32_t shard, const std::vector<std::string>& members,
                                     SizeSource* from = nullptr) const;
  // Every member of sample i, in its shard's order.
  void members(int64_t i, std::vector<MemberRef>& out) const;
  // The label a tar shard's index holds for sample i (its .cls member parsed); -1 otherwise.
  int64_t label(int64_t i) const;
  // Sample i's key: a tar sample's own; the sample's position in the dataset (8 digits or more)
  // for columns and tokens.
  std::string key(int64_t i) const;

  // File `file` of sample i's shard, open. For a fetched dataset: waits at the gate while
  // `keep_waiting()` says to (see io::ShardGate::acquire); otherwise returns at once.
  std::shared_ptr<const io::ShardFile> acquire_file(
      int64_t i, uint32_t file, const std::function<bool()>& keep_waiting) const;
  // The decoded row group that sample i (of a kRowGroup shard) is a row of, waiting for it as
  // acquire_file does; its row is i - shard_first(shard_of(i)). member() does not serve these
  // shards: their members are the row group's cells.
  std::shared_ptr<const io::RowGroup> acquire_rows(int64_t i,
                                                   const std::function<bool()>& keep_waiting) const;
  // The same without waiting: throws Error(kIO) if a fetched file is not local now.
  std::shared_ptr<const io::ShardFile> file(int64_t i, uint32_t file) const;
  const std::string& shard_name(int64_t i) const;  // its first file's name, for messages
  const std::vector<std::string>& classes() const { return classes_; }
  // Every member of a tar shard has a CRC32C in its index (a stoker pack's).
  bool has_crc() const { return has_crc_; }
  const std::string& path() const { return path_; }
  // Reads every member of tar shard `shard` from `file` and checks it against the index's
  // CRC32C (where the index has them). Throws Error(kCorruptData) naming the shard, the key and
  // the member.
  void verify_shard_file(uint32_t shard, const io::ShardFile& file) const;
  // Checks `file` as the data file of gate entry `entry` (what a fetcher has brought): its size;
  // a tar shard's every member against its index (verify_shard_file); a column's .npy header
  // against the manifest (dtype, shape, rows, where its data starts); and the whole file's
  // CRC32C where the manifest has one. Throws Error(kCorruptData) naming the file.
  void verify_file(uint32_t entry, const io::ShardFile& file) const;
  // Where a fetcher hands files over (one gate entry per data file: a tar shard's is its
  // shard's number); null unless opened with open_fetched().
  const std::shared_ptr<io::ShardGate>& gate() const { return gate_; }
  // The data files of a shard: their names in the pack folder and sizes (the files' own at
  // open, or (fetched) the manifest's), and the whole file's CRC32C where the manifest has one
  // (columns, tokens).
  struct FileInfo {
    std::string name;
    uint64_t bytes = 0;
    std::optional<uint32_t> crc32c;
    uint32_t gate_entry = 0;
  };
  const std::vector<FileInfo>& shard_files(uint32_t shard) const { return shards_.at(shard).files; }
  // Throws Error(kIO) naming the first file truncated or rewritten since open() (fetched
  // datasets: since it arrived).
  void check_unchanged() const;
  // This dataset with every data file read into memory now (a fetched one waits for each file
  // while keep_waiting() says to): reads are then memory copies. Bytes held: resident_bytes().
  std::shared_ptr<const Dataset> resident(const std::function<bool()>& keep_waiting) const;
  // What resident() holds: the data files' sizes (an index or manifest is not counted).
  uint64_t resident_bytes() const;
  // Data files in order, with their sizes and the bytes of each in the page cache now.
  struct ShardCache {
    std::string path;
    uint64_t bytes = 0, resident = 0;
  };
  std::vector<ShardCache> page_cache() const;

 private:
  Dataset() = default;
  struct Column {
    std::string name;
    RawLayout raw;             // per row
    uint64_t data_offset = 0;  // of row 0 in its file
    uint64_t row_bytes = 0;
  };
  struct Shard {
    ShardLayout layout = ShardLayout::kTar;
    std::vector<FileInfo> files;
    std::vector<std::shared_ptr<const io::ShardFile>> open;  // per file; empty when fetched
    ShardIndex index;                                        // kTar
    std::string sizes_path;       // kTar of an index without sizes: where its sizes file goes
    std::vector<Column> columns;  // kColumns: one per file, in order
    // kTokens: where token 0 is, the element type and the window.
    uint64_t token_offset = 0;
    RawLayout window;  // {dtype, {seq_len + 1}}
    // kRowGroup: the members its rows have (the row group's columns) and its first row's.
    std::vector<std::string> row_columns;
    int64_t first_row = 0;
    // kTar of a pack with sidecars: each sidecar's shard for this one (its index, and its data
    // file's place in `files`), the same samples in the same order.
    struct Attachment {
      ShardIndex index;
      uint32_t file = 0;
    };
    std::vector<Attachment> attached;
  };
  // A sidecar's member ids: kAttachedId * (sidecar + 1) + its id in the sidecar's index.
  static constexpr int kAttachedId = 1 << 20;
  void verify_tar(const ShardIndex& index, const std::string& name,
                  const io::ShardFile& file) const;
  void add_shard(Shard shard, int64_t samples);
  static std::shared_ptr<Dataset> open_manifest(const std::string& path, bool fetched,
                                                const DatasetOptions& options);
  // The data files open now (a fetched dataset: those that have arrived).
  std::vector<std::shared_ptr<const io::ShardFile>> open_files() const;
  const Shard& shard_at(int64_t i) const { return shards_[shard_of(i)]; }

  std::string path_;
  std::vector<Shard> shards_;
  std::vector<int64_t> shard_starts_{0};  // sample index of each shard's first, and the total
  std::vector<std::string> classes_;
  std::vector<std::string> attached_;  // the sidecars' names
  bool has_crc_ = true;
  int64_t seq_len_ = 0;
  std::shared_ptr<io::ShardGate> gate_;
};

const char* shard_layout_name(ShardLayout layout);

}  // namespace stoker::format
