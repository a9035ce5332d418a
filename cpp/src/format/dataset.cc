#include "stoker/format/dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/core/npy.h"

namespace stoker::format {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void manifest_error(const std::string& path, const std::string& why) {
  throw Error(ErrorCode::kCorruptData, "invalid manifest: " + why, path);
}

// A manifest integer in [0, max]. nlohmann's get<int>() would static_cast a JSON float (1e300),
// which is undefined behaviour when it does not fit: only JSON integers are taken.
int64_t manifest_count(const nlohmann::json& j, const char* name, const std::string& path,
                       int64_t max = INT64_MAX) {
  const nlohmann::json& v = j.at(name);
  if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(max))
    return static_cast<int64_t>(v.get<uint64_t>());
  if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= max)
    return v.get<int64_t>();
  manifest_error(path, std::string(name) + " must be an integer in [0, " + std::to_string(max) +
                           "], not " + v.dump());
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A file name in the pack folder: no path separators, not "." or "..".
std::string file_name(const nlohmann::json& j, const char* key, const std::string& manifest) {
  const std::string name = j.at(key).get<std::string>();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    manifest_error(manifest, "file names may not be empty or contain '/': " + name);
  return name;
}

DType manifest_dtype(const nlohmann::json& j, const std::string& manifest) {
  const std::string name = j.at("dtype").get<std::string>();
  const auto dtype = dtype_from_name(name);
  if (!dtype) manifest_error(manifest, "unknown dtype '" + name + "'");
  return *dtype;
}

// Bytes of one row of `shape` elements of `dtype`, overflow-checked; also bounds the row.
uint64_t row_bytes(const RawLayout& raw, const std::string& where) {
  uint64_t bytes = dtype_size(raw.dtype);
  for (int64_t d : raw.shape)
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) ||
        bytes > (uint64_t{1} << 40))
      throw Error(ErrorCode::kResourceLimit, "a row of this shape is too large", where);
  return bytes;
}

// Reads and checks a column or token file's .npy header: `dtype`, and `shape` after its first
// dimension (which must be `rows`, unless rows < 0: then it is returned).
uint64_t read_npy_header(const io::ShardFile& file, const RawLayout& row, int64_t& rows) {
  constexpr size_t kMaxPrefix = 12 + 10000;  // magic, length, the largest header parse_npy takes
  std::vector<uint8_t> prefix;
  file.read(0, std::min<uint64_t>(file.size(), kMaxPrefix), prefix);
  NpyLimits limits;
  limits.max_elements = int64_t{1} << 50;  // a whole column; a row is bounded by row_bytes()
  NpyHeader h;
  try {
    h = parse_npy_header(prefix.data(), prefix.size(), file.size(), limits);
  } catch (const Error& e) {
    throw Error(e.code(), e.reason(), file.path());
  }
  auto describe = [](DType t, const std::vector<int64_t>& shape) {
    std::string s = std::string(dtype_name(t)) + " (";
    for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
    return s + (shape.size() == 1 ? ",)" : ")");
  };
  std::vector<int64_t> expected = row.shape;
  expected.insert(expected.begin(), rows < 0 ? (h.shape.empty() ? -1 : h.shape[0]) : rows);
  if (h.dtype != row.dtype || h.shape != expected)
    throw Error(ErrorCode::kCorruptData,
                "the file holds " + describe(h.dtype, h.shape) + ", the manifest says " +
                    describe(row.dtype, expected),
                file.path());
  rows = expected[0];
  return h.data_offset;
}

// A member's recorded image size (the members are one array: its place is its offset there).
ImageSize image_size_of(const ShardIndex& index, const MemberRecord& m) {
  if (!index.has_image_sizes()) return {};
  return index.image_sizes[static_cast<size_t>(&m - index.members.data())];
}

// Writes `bytes` to `path` by rename; false where the folder refuses (a read-only pack).
bool try_write_file(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".partial-" + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return false;
  const bool ok =
      std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

std::string sample_key(int64_t i) {
  std::string s = std::to_string(i);
  return s.size() >= 8 ? s : std::string(8 - s.size(), '0') + s;
}

}  // namespace

const char* shard_layout_name(ShardLayout layout) {
  switch (layout) {
    case ShardLayout::kTar: return "tar";
    case ShardLayout::kColumns: return "columns";
    case ShardLayout::kTokens: return "tokens";
    case ShardLayout::kRowGroup: return "row group";
  }
  return "?";
}

void Dataset::add_shard(Shard shard, int64_t samples) {
  STOKER_CHECK(shards_.size() < UINT32_MAX - 1, ErrorCode::kResourceLimit, "too many shards");
  if (shard.layout == ShardLayout::kTar) {
    has_crc_ = has_crc_ && (shard.index.flags & kIndexFlagHasCrc);
  } else {
    has_crc_ = false;  // rows and windows carry no CRC of their own (files do: verify)
  }
  int64_t end;
  STOKER_CHECK(!__builtin_add_overflow(shard_starts_.back(), samples, &end),
               ErrorCode::kResourceLimit, "too many samples");
  shard_starts_.push_back(end);
  shards_.push_back(std::move(shard));
}

uint32_t Dataset::shard_of(int64_t i) const {
  if (i < 0 || i >= size())
    throw Error(ErrorCode::kInvalidArgument,
                "sample " + std::to_string(i) + " of " + std::to_string(size()));
  // The last shard whose first sample is <= i (empty shards have no samples to find).
  const auto it = std::upper_bound(shard_starts_.begin(), shard_starts_.end(), i);
  return static_cast<uint32_t>(it - shard_starts_.begin() - 1);
}

std::shared_ptr<const Dataset> Dataset::open(const std::string& path,
                                             const DatasetOptions& options) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    if (ends_with(path, ".bin") || ends_with(path, ".npy"))
      return open_token_files({path}, options);
    if (!ends_with(path, ".tar"))
      throw Error(ErrorCode::kInvalidArgument,
                  "expected a stoker pack folder, a .tar shard, a folder of .tar shards, or a "
                  "token file (.bin, .npy)",
                  path);
    return open_tars({path});
  }
  if (!fs::is_directory(path, ec)) throw Error(ErrorCode::kIO, "no such file or folder", path);

  const fs::path manifest_path = fs::path(path) / kManifestName;
  if (!fs::exists(manifest_path, ec)) {
    std::vector<std::string> tars;
    bool partial = false;
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string name = e.path().filename().string();
      if (ends_with(name, ".partial") || ends_with(name, ".idx")) partial = true;
      if (e.is_regular_file() && ends_with(name, ".tar")) tars.push_back(e.path().string());
    }
    if (partial)
      throw Error(ErrorCode::kCorruptData,
                  "incomplete stoker pack: shards or indexes without manifest.json (was packing "
                  "interrupted?)",
                  path);
    if (tars.empty())
      throw Error(ErrorCode::kInvalidArgument, "no manifest.json and no .tar shards here", path);
    std::sort(tars.begin(), tars.end());
    return open_tars(tars);
  }

  return open_manifest(path, false, options);
}

std::shared_ptr<const Dataset> Dataset::open_fetched(const std::string& path,
                                                     const DatasetOptions& options) {
  std::error_code ec;
  if (!fs::exists(fs::path(path) / kManifestName, ec))
    throw Error(ErrorCode::kIO, "no manifest.json in the cache folder", path);
  return open_manifest(path, true, options);
}

std::shared_ptr<Dataset> Dataset::open_manifest(const std::string& path, bool fetched,
                                                const DatasetOptions& options) {
  const std::string manifest_path = (fs::path(path) / kManifestName).string();
  const std::vector<uint8_t> bytes = io::read_file(manifest_path);
  nlohmann::json m = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (m.is_discarded() || !m.is_object()) manifest_error(manifest_path, "not a JSON object");
  auto dataset = std::shared_ptr<Dataset>(new Dataset());
  dataset->path_ = path;
  std::vector<std::string> gate_names;
  std::vector<uint64_t> gate_sizes;
  // A data file of the pack: opened (or, fetched, its size taken from the manifest), and given
  // its gate entry.
  // Column and token files are read a small row at a time, at random: mapped (io::ShardFile).
  // A sidecar's file is in its folder (`in_folder`, its name checked already).
  auto data_file = [&](Shard& shard, const nlohmann::json& j, const char* name_key, bool mapped,
                       bool in_folder = false) {
    FileInfo info;
    info.name =
        in_folder ? j.at(name_key).get<std::string>() : file_name(j, name_key, manifest_path);
    if (j.contains("crc32c"))
      info.crc32c = static_cast<uint32_t>(manifest_count(j, "crc32c", manifest_path, UINT32_MAX));
    if (fetched) {  // the file arrives later: its size is the manifest's, checked on arrival
      if (!j.contains("bytes"))
        manifest_error(manifest_path, info.name +
                                          " has no \"bytes\": a pack read from object "
                                          "storage needs each file's size");
      info.bytes = static_cast<uint64_t>(manifest_count(j, "bytes", manifest_path));
    } else {
      auto file =
          std::make_shared<const io::ShardFile>((fs::path(path) / info.name).string(), mapped);
      info.bytes = file->size();
      if (j.contains("bytes") &&
          info.bytes != static_cast<uint64_t>(manifest_count(j, "bytes", manifest_path)))
        throw Error(
            ErrorCode::kCorruptData,
            std::to_string(info.bytes) + " bytes, the manifest says " + j.at("bytes").dump(),
            file->path());
      shard.open.push_back(std::move(file));
    }
    info.gate_entry = static_cast<uint32_t>(gate_names.size());
    gate_names.push_back(info.name);
    gate_sizes.push_back(info.bytes);
    shard.files.push_back(std::move(info));
  };
  try {
    const std::string format = m.at("format").get<std::string>();
    const auto version = manifest_count(m, "version", manifest_path, INT32_MAX);
    const int known = format == "stoker-pack"     ? kPackFormatVersion
                      : format == "stoker-arrays" ? kArrayPackFormatVersion
                      : format == "stoker-tokens" ? kTokenPackFormatVersion
                                                  : 0;
    if (known == 0) manifest_error(manifest_path, "not a stoker pack (format '" + format + "')");
    if (version < 1 || version > known)
      throw Error(ErrorCode::kUnsupported,
                  format + " version " + std::to_string(version) + " (this stoker reads 1-" +
                      std::to_string(known) + ")",
                  manifest_path);
    if (m.contains("classes")) dataset->classes_ = m.at("classes").get<std::vector<std::string>>();

    if (format == "stoker-pack") {
      for (const auto& s : m.at("shards")) {
        Shard shard;
        shard.layout = ShardLayout::kTar;
        data_file(shard, s, "tar", false);
        const std::string idx = file_name(s, "index", manifest_path);
        const auto expected =
            static_cast<uint64_t>(manifest_count(s, "num_samples", manifest_path));
        const std::vector<uint8_t> index_bytes = io::read_file((fs::path(path) / idx).string());
        shard.index =
            parse_shard_index(index_bytes.data(), index_bytes.size(), shard.files[0].bytes, idx);
        if (!shard.index.has_image_sizes())  // shard-000003.idx -> shard-000003.sizes
          shard.sizes_path = (fs::path(path) / fs::path(idx).replace_extension(".sizes")).string();
        if (shard.index.samples.size() != expected)
          manifest_error(manifest_path, shard.files[0].name + " has " +
                                            std::to_string(shard.index.samples.size()) +
                                            " samples, the manifest says " +
                                            std::to_string(expected));
        const auto n = static_cast<int64_t>(shard.index.samples.size());
        dataset->add_shard(std::move(shard), n);
      }
      // Sidecars (stoker.attach): their data files' gate entries after the pack's own.
      const fs::path attached_path = fs::path(path) / kAttachedName;
      std::error_code ec;
      if (options.sidecars && fs::exists(attached_path, ec)) {
        const std::string where = attached_path.string();
        try {
          const std::vector<uint8_t> raw = io::read_file(where);
          const nlohmann::json a = nlohmann::json::parse(raw.begin(), raw.end(), nullptr, false);
          auto bad = [&](const std::string& why) {
            throw Error(ErrorCode::kCorruptData, why, where);
          };
          if (a.is_discarded() || !a.is_object() || !a.contains("format") ||
              a.at("format") != "stoker-attached" || !a.contains("sidecars") ||
              !a.at("sidecars").is_array())
            bad("not a list of stoker sidecars");
          const auto version = manifest_count(a, "version", where, INT32_MAX);
          if (version < 1) bad("version " + std::to_string(version));
          if (version > kAttachedFormatVersion)
            throw Error(ErrorCode::kUnsupported,
                        "sidecars of version " + a.at("version").dump() + " (this stoker reads 1)",
                        where);
          if (a.at("sidecars").size() > kMaxSidecars)
            bad(std::to_string(a.at("sidecars").size()) + " sidecars (at most " +
                std::to_string(kMaxSidecars) + ")");
          const uint32_t manifest_crc = crc32c(bytes.data(), bytes.size());
          for (const auto& sidecar : a.at("sidecars")) {
            const std::string name = sidecar.at("name").get<std::string>();
            const bool valid_name = !name.empty() && name.size() <= 64 && name[0] != '.' &&
                                    std::all_of(name.begin(), name.end(), [](char c) {
                                      return std::isalnum(static_cast<unsigned char>(c)) ||
                                             c == '_' || c == '-' || c == '.';
                                    });
            if (!valid_name)
              bad("a sidecar's name must be 1-64 of A-Z a-z 0-9 _ - . ('" + name + "')");
            if (std::find(dataset->attached_.begin(), dataset->attached_.end(), name) !=
                dataset->attached_.end())
              bad("sidecar '" + name + "' is listed twice");
            const auto made_for =
                manifest_count(sidecar, "pack_manifest_crc32c", where, UINT32_MAX);
            if (static_cast<uint32_t>(made_for) != manifest_crc)
              throw Error(
                  ErrorCode::kInvalidArgument,
                  "sidecar '" + name + "' was made for another pack (for a manifest of " +
                      "CRC32C " + std::to_string(made_for) + ", this one's is " +
                      std::to_string(manifest_crc) +
                      "): attach it again (stoker.attach(..., overwrite=True)) or remove it",
                  where);
            const auto& shards = sidecar.at("shards");
            if (!shards.is_array() || shards.size() != dataset->shards_.size())
              bad("sidecar '" + name + "' has " + std::to_string(shards.size()) +
                  " shards, the pack " + std::to_string(dataset->shards_.size()));
            const std::string prefix = std::string("attached/") + name + "/";
            for (size_t k = 0; k < shards.size(); ++k) {
              const auto& sj = shards[k];
              Shard& shard = dataset->shards_[k];
              for (const char* key : {"tar", "index"}) {
                const std::string f = sj.at(key).get<std::string>();
                if (f.rfind(prefix, 0) != 0 || f.size() == prefix.size() ||
                    f.find('/', prefix.size()) != std::string::npos ||
                    f.find("..") != std::string::npos)
                  bad("sidecar '" + name + "': a file outside " + prefix + " ('" + f + "')");
              }
              Shard::Attachment attachment;
              attachment.file = static_cast<uint32_t>(shard.files.size());
              data_file(shard, sj, "tar", false, true);
              const std::string idx = sj.at("index").get<std::string>();
              const std::vector<uint8_t> index_bytes =
                  io::read_file((fs::path(path) / idx).string());
              attachment.index = parse_shard_index(index_bytes.data(), index_bytes.size(),
                                                   shard.files.back().bytes, idx);
              // The pack shard's samples, in its order, each with the sidecar's one member.
              const ShardIndex& own = shard.index;
              const ShardIndex& side = attachment.index;
              if (own.find_name(name) >= 0)
                throw Error(ErrorCode::kInvalidArgument,
                            "sidecar '" + name + "': the pack's samples have a member of that name",
                            shard.files[0].name);
              if (side.samples.size() != own.samples.size())
                throw Error(ErrorCode::kCorruptData,
                            std::to_string(side.samples.size()) + " samples, its pack shard " +
                                std::to_string(own.samples.size()),
                            idx);
              const int id = side.find_name(name);
              for (size_t r = 0; r < own.samples.size(); ++r) {
                const SampleRecord& sample = side.samples[r];
                if (sample.key != own.samples[r].key)
                  throw Error(ErrorCode::kCorruptData,
                              "sample " + std::to_string(r) + " is '" + sample.key +
                                  "', the pack's '" + own.samples[r].key + "'",
                              idx);
                if (sample.num_members != 1 || side.members_of(sample)[0].name != id)
                  throw Error(ErrorCode::kCorruptData,
                              "a sample without exactly one member '" + name + "'", idx,
                              sample.key);
              }
              shard.attached.push_back(std::move(attachment));
            }
            dataset->attached_.push_back(name);
          }
        } catch (const nlohmann::json::exception& e) {
          throw Error(ErrorCode::kCorruptData,
                      std::string("not a list of stoker sidecars: ") + e.what(), where);
        }
      }
    } else if (format == "stoker-arrays") {
      // The fields' row layouts, in manifest order: every shard has one file per field.
      std::vector<std::pair<std::string, RawLayout>> fields;
      for (const auto& f : m.at("fields")) {
        RawLayout raw;
        raw.dtype = manifest_dtype(f, manifest_path);
        raw.shape = f.at("shape").get<std::vector<int64_t>>();
        if (raw.shape.size() > 8) manifest_error(manifest_path, "more than 8 dimensions");
        const std::string name = f.at("name").get<std::string>();
        if (name.empty()) manifest_error(manifest_path, "a field has no name");
        for (const auto& other : fields)
          if (other.first == name) manifest_error(manifest_path, "field '" + name + "' twice");
        row_bytes(raw, manifest_path);  // bounded before any file is read
        fields.emplace_back(name, std::move(raw));
      }
      if (fields.empty()) manifest_error(manifest_path, "an array pack needs at least one field");
      constexpr uint64_t kSmallRowBytes = 256, kSmallColumnsBytes = uint64_t{256} << 20;
      uint64_t small_columns = 0;
      for (const auto& s : m.at("shards")) {
        Shard shard;
        shard.layout = ShardLayout::kColumns;
        const int64_t rows = manifest_count(s, "num_samples", manifest_path, int64_t{1} << 40);
        const auto& files = s.at("files");
        if (!files.is_array() || files.size() != fields.size())
          manifest_error(manifest_path, "each shard needs one file per field, in field order");
        for (size_t k = 0; k < fields.size(); ++k) {
          const auto& f = files[k];
          if (f.at("field").get<std::string>() != fields[k].first)
            manifest_error(manifest_path, "a shard's files are not in field order");
          data_file(shard, f, "file", true);
          Column column;
          column.name = fields[k].first;
          column.raw = fields[k].second;
          column.row_bytes = row_bytes(column.raw, manifest_path);
          const FileInfo& info = shard.files.back();
          int64_t file_rows = rows;
          if (fetched) {  // the header is known from the manifest, checked when the file arrives
            column.data_offset =
                static_cast<uint64_t>(manifest_count(f, "data_offset", manifest_path, 1 << 20));
          } else {
            column.data_offset = read_npy_header(*shard.open.back(), column.raw, file_rows);
          }
          uint64_t data;
          if (__builtin_mul_overflow(column.row_bytes, static_cast<uint64_t>(rows), &data) ||
              __builtin_add_overflow(data, column.data_offset, &data) || data != info.bytes)
            throw Error(ErrorCode::kCorruptData,
                        "holds " + std::to_string(info.bytes) + " bytes, not the " +
                            std::to_string(rows) + " rows of " + std::to_string(column.row_bytes) +
                            " bytes the manifest says",
                        info.name);
          // A column of small rows (labels, a few features) is held in memory, up to
          // kSmallColumnsBytes in all: a pread for 8 bytes costs what one for 3 KB does.
          if (!fetched && column.row_bytes <= kSmallRowBytes &&
              small_columns + info.bytes <= kSmallColumnsBytes) {
            small_columns += info.bytes;
            shard.open.back() = io::ShardFile::in_memory(*shard.open.back());
          }
          shard.columns.push_back(std::move(column));
        }
        dataset->add_shard(std::move(shard), rows);
      }
    } else {  // stoker-tokens
      STOKER_CHECK(options.seq_len > 0, ErrorCode::kInvalidArgument,
                   "a token pack is read in windows: give seq_len (> 0)");
      const DType dtype = manifest_dtype(m, manifest_path);
      if (dtype != DType::kUInt16 && dtype != DType::kUInt32 && dtype != DType::kInt32)
        manifest_error(manifest_path, "tokens are uint16, uint32 or int32");
      if (options.token_dtype && *options.token_dtype != dtype)
        throw Error(ErrorCode::kInvalidArgument,
                    "the pack's tokens are " + std::string(dtype_name(dtype)) + ", not " +
                        std::string(dtype_name(*options.token_dtype)),
                    manifest_path);
      dataset->seq_len_ = options.seq_len;
      for (const auto& s : m.at("shards")) {
        Shard shard;
        shard.layout = ShardLayout::kTokens;
        data_file(shard, s, "file", true);
        const int64_t tokens = manifest_count(s, "num_tokens", manifest_path);
        uint64_t bytes;
        if (__builtin_mul_overflow(static_cast<uint64_t>(tokens), dtype_size(dtype), &bytes) ||
            bytes != shard.files[0].bytes)
          throw Error(ErrorCode::kCorruptData,
                      "holds " + std::to_string(shard.files[0].bytes) + " bytes, not the " +
                          std::to_string(tokens) + " tokens the manifest says",
                      shard.files[0].name);
        shard.window = {dtype, {options.seq_len + 1}};
        dataset->add_shard(std::move(shard), tokens < 1 ? 0 : (tokens - 1) / options.seq_len);
      }
    }
    if (fetched) dataset->gate_ = std::make_shared<io::ShardGate>(gate_names, gate_sizes);
    // A token pack's samples are windows of the reader's length: it has no count of its own.
    if (format != "stoker-tokens" &&
        manifest_count(m, "num_samples", manifest_path) != dataset->size())
      manifest_error(manifest_path, "num_samples does not match the shards");
  } catch (const nlohmann::json::exception& e) {
    manifest_error(manifest_path, e.what());
  }
  return dataset;
}

std::shared_ptr<const Dataset> Dataset::open_tars(const std::vector<std::string>& tar_paths) {
  STOKER_CHECK(!tar_paths.empty(), ErrorCode::kInvalidArgument, "no shards given");
  auto dataset = std::shared_ptr<Dataset>(new Dataset());
  dataset->path_ =
      tar_paths.size() == 1 ? tar_paths[0] : fs::path(tar_paths[0]).parent_path().string();
  for (const auto& p : tar_paths) {
    auto file = std::make_shared<const io::ShardFile>(p);
    Shard shard;
    shard.layout = ShardLayout::kTar;
    shard.index = index_webdataset_tar(*file);
    shard.files.push_back({fs::path(p).filename().string(), file->size(), std::nullopt,
                           static_cast<uint32_t>(dataset->shards_.size())});
    shard.open.push_back(std::move(file));
    const auto n = static_cast<int64_t>(shard.index.samples.size());
    dataset->add_shard(std::move(shard), n);
  }
  return dataset;
}

std::shared_ptr<const Dataset> Dataset::open_row_groups(const std::string& path,
                                                        std::vector<RowGroupInfo> row_groups,
                                                        std::vector<std::string> classes) {
  STOKER_CHECK(!row_groups.empty(), ErrorCode::kInvalidArgument, "no row groups given");
  auto dataset = std::shared_ptr<Dataset>(new Dataset());
  dataset->path_ = path;
  dataset->classes_ = std::move(classes);
  std::vector<std::string> names;
  for (RowGroupInfo& g : row_groups) {
    STOKER_CHECK(g.rows >= 0 && g.first_row >= 0, ErrorCode::kInvalidArgument,
                 g.name + ": a negative row count");
    Shard shard;
    shard.layout = ShardLayout::kRowGroup;
    shard.files.push_back({g.name, 0, std::nullopt, static_cast<uint32_t>(names.size())});
    shard.row_columns = std::move(g.columns);
    shard.first_row = g.first_row;
    names.push_back(std::move(g.name));
    dataset->add_shard(std::move(shard), g.rows);
  }
  std::vector<uint64_t> sizes(names.size(), 0);
  dataset->gate_ = std::make_shared<io::ShardGate>(std::move(names), std::move(sizes));
  return dataset;
}

std::shared_ptr<const Dataset> Dataset::open_token_files(const std::vector<std::string>& paths,
                                                         const DatasetOptions& options) {
  STOKER_CHECK(!paths.empty(), ErrorCode::kInvalidArgument, "no token files given");
  STOKER_CHECK(options.seq_len > 0, ErrorCode::kInvalidArgument,
               "token files are read in windows: give seq_len (> 0)");
  auto dataset = std::shared_ptr<Dataset>(new Dataset());
  dataset->path_ = paths.size() == 1 ? paths[0] : fs::path(paths[0]).parent_path().string();
  dataset->seq_len_ = options.seq_len;
  for (const auto& p : paths) {
    auto file = std::make_shared<const io::ShardFile>(p, true);
    Shard shard;
    shard.layout = ShardLayout::kTokens;
    int64_t tokens;
    if (ends_with(p, ".npy")) {
      // The dtype is the file's own, unless given (then it must agree).
      NpyLimits limits;
      limits.max_elements = int64_t{1} << 50;
      std::vector<uint8_t> head;
      file->read(0, std::min<uint64_t>(file->size(), 12 + limits.max_header_bytes), head);
      NpyHeader h;
      try {
        h = parse_npy_header(head.data(), head.size(), file->size(), limits);
      } catch (const Error& e) {
        throw Error(e.code(), e.reason(), p);
      }
      if (options.token_dtype && h.dtype != *options.token_dtype)
        throw Error(ErrorCode::kInvalidArgument,
                    "holds " + std::string(dtype_name(h.dtype)) + " tokens, not " +
                        std::string(dtype_name(*options.token_dtype)),
                    p);
      if (h.shape.size() != 1)
        throw Error(ErrorCode::kCorruptData, "a token file is a 1-d array", p);
      shard.token_offset = h.data_offset;
      tokens = h.shape[0];
      shard.window = {h.dtype, {options.seq_len + 1}};
    } else {
      const DType dtype = options.token_dtype.value_or(DType::kUInt16);
      const uint64_t size = file->size();
      if (size % dtype_size(dtype) != 0)
        throw Error(ErrorCode::kCorruptData,
                    std::to_string(size) + " bytes is not a whole number of " +
                        std::string(dtype_name(dtype)) + " tokens",
                    p);
      tokens = static_cast<int64_t>(size / dtype_size(dtype));
      shard.window = {dtype, {options.seq_len + 1}};
    }
    const DType dtype = shard.window.dtype;
    if (dtype != DType::kUInt16 && dtype != DType::kUInt32 && dtype != DType::kInt32 &&
        dtype != DType::kInt64)
      throw Error(
          ErrorCode::kUnsupported,
          "tokens are uint16, uint32, int32 or int64, not " + std::string(dtype_name(dtype)), p);
    shard.files.push_back({fs::path(p).filename().string(), file->size(), std::nullopt,
                           static_cast<uint32_t>(dataset->shards_.size())});
    shard.open.push_back(std::move(file));
    dataset->add_shard(std::move(shard), tokens < 1 ? 0 : (tokens - 1) / options.seq_len);
  }
  return dataset;
}

int64_t Dataset::shard_tokens(uint32_t shard) const {
  const Shard& s = shards_.at(shard);
  if (s.layout != ShardLayout::kTokens) return 0;
  return static_cast<int64_t>((s.files[0].bytes - s.token_offset) / dtype_size(s.window.dtype));
}

Dataset::TokenSource Dataset::token_source(uint32_t shard) const {
  const Shard& s = shards_.at(shard);
  STOKER_CHECK(s.layout == ShardLayout::kTokens, ErrorCode::kInvalidArgument, "not a token shard");
  const std::string path =
      s.open.empty() ? (fs::path(path_) / s.files[0].name).string() : s.open[0]->path();
  return {path, s.token_offset, s.window.dtype};
}

int Dataset::find_member(uint32_t shard, std::string_view name) const {
  const Shard& s = shards_.at(shard);
  switch (s.layout) {
    case ShardLayout::kTar: {
      const int id = s.index.find_name(name);
      if (id >= 0) return id;
      for (size_t k = 0; k < s.attached.size(); ++k)
        if (const int a = s.attached[k].index.find_name(name); a >= 0)
          return kAttachedId * static_cast<int>(k + 1) + a;
      return -1;
    }
    case ShardLayout::kColumns:
      for (size_t k = 0; k < s.columns.size(); ++k)
        if (s.columns[k].name == name) return static_cast<int>(k);
      return -1;
    case ShardLayout::kTokens: return name == "tokens" ? 0 : -1;
    case ShardLayout::kRowGroup:
      for (size_t k = 0; k < s.row_columns.size(); ++k)
        if (s.row_columns[k] == name) return static_cast<int>(k);
      return -1;
  }
  return -1;
}

bool Dataset::member(int64_t i, int id, MemberRef& out) const {
  const uint32_t shard = shard_of(i);
  const Shard& s = shards_[shard];
  const auto row = static_cast<uint64_t>(i - shard_starts_[shard]);
  switch (s.layout) {
    case ShardLayout::kTar: {
      if (id < 0) return false;
      const ShardIndex* index = &s.index;
      uint32_t file = 0;
      if (id >= kAttachedId) {  // a sidecar's
        const auto& attachment = s.attached.at(static_cast<size_t>(id / kAttachedId - 1));
        index = &attachment.index;
        file = attachment.file;
        id %= kAttachedId;
      }
      const SampleRecord& r = index->samples[row];
      for (const MemberRecord& m : index->members_of(r)) {
        if (m.name != id) continue;
        out = {file,
               m.offset,
               m.size,
               m.crc32c,
               (index->flags & kIndexFlagHasCrc) != 0,
               nullptr,
               index->member_names[m.name],
               image_size_of(*index, m)};
        return true;
      }
      return false;
    }
    case ShardLayout::kColumns: {
      if (id < 0 || static_cast<size_t>(id) >= s.columns.size()) return false;
      const Column& c = s.columns[static_cast<size_t>(id)];
      // In range: rows * row_bytes + data_offset is the file's size (checked at open).
      out = {static_cast<uint32_t>(id),
             c.data_offset + row * c.row_bytes,
             c.row_bytes,
             0,
             false,
             &c.raw,
             c.name,
             {}};
      return true;
    }
    case ShardLayout::kTokens: {
      if (id != 0) return false;
      const uint64_t token = dtype_size(s.window.dtype);
      out = {0,
             s.token_offset + row * static_cast<uint64_t>(seq_len_) * token,
             static_cast<uint64_t>(seq_len_ + 1) * token,
             0,
             false,
             &s.window,
             "tokens",
             {}};
      return true;
    }
    case ShardLayout::kRowGroup:
      throw Error(ErrorCode::kInternal, "a row group's members are its cells (acquire_rows)",
                  s.files.at(0).name);
  }
  return false;
}

void Dataset::members(int64_t i, std::vector<MemberRef>& out) const {
  out.clear();
  const uint32_t shard = shard_of(i);
  const Shard& s = shards_[shard];
  MemberRef ref;
  if (s.layout == ShardLayout::kTar) {
    const auto row = static_cast<size_t>(i - shard_starts_[shard]);
    auto add = [&](const ShardIndex& index, uint32_t file) {
      for (const MemberRecord& m : index.members_of(index.samples[row]))
        out.push_back({file, m.offset, m.size, m.crc32c, (index.flags & kIndexFlagHasCrc) != 0,
                       nullptr, index.member_names[m.name], image_size_of(index, m)});
    };
    add(s.index, 0);
    for (const Shard::Attachment& a : s.attached) add(a.index, a.file);
    return;
  }
  if (s.layout == ShardLayout::kRowGroup) return;  // its cells are in the row group
  const int n = s.layout == ShardLayout::kColumns ? static_cast<int>(s.columns.size()) : 1;
  for (int id = 0; id < n; ++id)
    if (member(i, id, ref)) out.push_back(ref);
}

const char* size_source_name(SizeSource source) {
  switch (source) {
    case SizeSource::kIndex: return "index";
    case SizeSource::kSizesFile: return "sizes file";
    case SizeSource::kHeaders: return "headers";
    case SizeSource::kLayout: return "layout";
    case SizeSource::kNone: return "none";
  }
  return "?";
}

std::vector<ImageSize> Dataset::image_sizes(uint32_t shard, const std::vector<std::string>& members,
                                            SizeSource* from) const {
  const Shard& s = shards_.at(shard);
  const auto n = static_cast<size_t>(shard_samples(shard));
  std::vector<ImageSize> out(n);
  SizeSource source = SizeSource::kNone;
  if (s.layout == ShardLayout::kRowGroup)
    throw Error(ErrorCode::kUnsupported,
                "Parquet records no image sizes: they are read from the images' headers "
                "(stoker.parquet's ParquetPack.image_sizes), not through the engine",
                s.files.at(0).name);
  if (s.layout == ShardLayout::kColumns) {
    // An Image reads a uint8 column of rows (H, W[, C]): every row is the column's size.
    for (const std::string& name : members) {
      const int id = find_member(shard, name);
      if (id < 0) continue;
      const RawLayout& raw = s.columns[static_cast<size_t>(id)].raw;
      if (raw.shape.size() < 2 || raw.shape[0] < 1 || raw.shape[1] < 1 ||
          raw.shape[0] > kMaxRecordedSide || raw.shape[1] > kMaxRecordedSide)
        continue;
      std::fill(
          out.begin(), out.end(),
          ImageSize{static_cast<uint32_t>(raw.shape[1]), static_cast<uint32_t>(raw.shape[0])});
      source = SizeSource::kLayout;
      break;
    }
  } else if (s.layout == ShardLayout::kTar) {
    std::vector<ImageSize> probed;
    const std::vector<ImageSize>* sizes = &s.index.image_sizes;
    source = SizeSource::kIndex;
    if (!s.index.has_image_sizes()) {
      std::error_code ec;
      if (!s.sizes_path.empty() && fs::exists(s.sizes_path, ec)) {
        // A cache: one that does not parse, or was written for another index (the pack was
        // replaced since), is read again from the images and written anew.
        try {
          const std::vector<uint8_t> bytes = io::read_file(s.sizes_path);
          probed = parse_image_sizes(bytes.data(), bytes.size(), s.index,
                                     fs::path(s.sizes_path).filename().string());
          source = SizeSource::kSizesFile;
        } catch (const Error&) {
          probed.clear();
        }
      }
      if (source != SizeSource::kSizesFile) {
        if (gate_)
          throw Error(ErrorCode::kUnsupported,
                      "this pack's index records no image sizes (it was packed before index "
                      "version 3), and reading them from its images needs every shard here: "
                      "pack it again with this stoker, or read it from a local copy once",
                      s.files.at(0).name);
        probed = probe_image_sizes(*s.open.at(0), s.index);
        source = SizeSource::kHeaders;
        if (!s.sizes_path.empty())
          try_write_file(s.sizes_path, serialize_image_sizes(s.index, probed));
      }
      sizes = &probed;
    }
    std::vector<int> ids;
    for (const std::string& name : members) ids.push_back(s.index.find_name(name));
    for (size_t row = 0; row < n; ++row) {
      const SampleRecord& r = s.index.samples[row];
      bool done = false;
      for (int id : ids) {  // in order of preference
        if (id < 0) continue;
        for (uint32_t k = r.first_member; k < r.first_member + r.num_members; ++k) {
          if (s.index.members[k].name != id) continue;
          out[row] = (*sizes)[k];
          done = true;
          break;
        }
        if (done) break;
      }
    }
  }
  if (from) *from = source;
  return out;
}

int64_t Dataset::label(int64_t i) const {
  const uint32_t shard = shard_of(i);
  const Shard& s = shards_[shard];
  if (s.layout != ShardLayout::kTar) return -1;
  return s.index.samples[static_cast<size_t>(i - shard_starts_[shard])].label;
}

std::string Dataset::key(int64_t i) const {
  const uint32_t shard = shard_of(i);
  const Shard& s = shards_[shard];
  if (s.layout == ShardLayout::kRowGroup)
    return std::to_string(s.first_row + (i - shard_starts_[shard]));
  if (s.layout != ShardLayout::kTar) return sample_key(i);
  return s.index.samples[static_cast<size_t>(i - shard_starts_[shard])].key;
}

std::vector<std::shared_ptr<const io::ShardFile>> Dataset::open_files() const {
  std::vector<std::shared_ptr<const io::ShardFile>> out;
  for (const Shard& s : shards_)
    for (size_t k = 0; k < s.files.size(); ++k) {
      auto file = gate_ ? gate_->peek(s.files[k].gate_entry) : s.open[k];
      if (file) out.push_back(std::move(file));
    }
  return out;
}

uint64_t Dataset::resident_bytes() const {
  uint64_t total = 0;
  for (const Shard& s : shards_)
    for (const FileInfo& f : s.files) total += f.bytes;
  return total;
}

std::shared_ptr<const Dataset> Dataset::resident(const std::function<bool()>& keep_waiting) const {
  for (const Shard& s : shards_)
    if (s.layout == ShardLayout::kRowGroup)
      throw Error(ErrorCode::kUnsupported,
                  "Parquet row groups are held decoded while read, not "
                  "resident",
                  s.files.at(0).name);
  auto copy = std::shared_ptr<Dataset>(new Dataset());
  copy->path_ = path_;
  copy->shard_starts_ = shard_starts_;
  copy->classes_ = classes_;
  copy->attached_ = attached_;
  copy->has_crc_ = has_crc_;
  copy->seq_len_ = seq_len_;
  for (const Shard& s : shards_) {
    Shard shard = s;
    shard.open.clear();
    for (size_t k = 0; k < s.files.size(); ++k) {
      const auto file = gate_ ? gate_->acquire(s.files[k].gate_entry, keep_waiting) : s.open[k];
      shard.open.push_back(io::ShardFile::in_memory(*file));
    }
    copy->shards_.push_back(std::move(shard));
  }
  return copy;
}

std::vector<Dataset::ShardCache> Dataset::page_cache() const {
  std::vector<ShardCache> out;
  for (const auto& f : open_files()) out.push_back({f->path(), f->size(), f->resident_bytes()});
  return out;
}

void Dataset::check_unchanged() const {
  for (const auto& f : open_files()) f->check_unchanged();
}

void Dataset::verify_shard_file(uint32_t shard, const io::ShardFile& file) const {
  const Shard& s = shards_.at(shard);
  if (s.layout == ShardLayout::kTar) verify_tar(s.index, s.files[0].name, file);
}

void Dataset::verify_tar(const ShardIndex& index, const std::string& name,
                         const io::ShardFile& file) const {
  if (!(index.flags & kIndexFlagHasCrc)) return;
  std::vector<uint8_t> bytes;
  for (const SampleRecord& record : index.samples) {
    for (const MemberRecord& m : index.members_of(record)) {
      file.read(m.offset, m.size, bytes);
      if (crc32c(bytes.data(), bytes.size()) != m.crc32c)
        throw Error(ErrorCode::kCorruptData, "CRC32C mismatch: not the bytes the index describes",
                    name, record.key, index.member_names[m.name]);
    }
  }
}

std::vector<std::string> Dataset::attached() const { return attached_; }

std::vector<std::string> Dataset::member_names(uint32_t shard) const {
  const Shard& s = shards_.at(shard);
  return s.layout == ShardLayout::kTar ? s.index.member_names : std::vector<std::string>{};
}

void Dataset::verify_file(uint32_t entry, const io::ShardFile& file) const {
  for (uint32_t shard = 0; shard < shards_.size(); ++shard) {
    const Shard& s = shards_[shard];
    for (size_t k = 0; k < s.files.size(); ++k) {
      const FileInfo& info = s.files[k];
      if (info.gate_entry != entry) continue;
      if (file.size() != info.bytes)
        throw Error(
            ErrorCode::kCorruptData,
            std::to_string(file.size()) + " bytes, the manifest says " + std::to_string(info.bytes),
            info.name);
      if (s.layout == ShardLayout::kTar && k == 0) return verify_shard_file(shard, file);
      if (s.layout == ShardLayout::kTar) {  // a sidecar's shard
        for (const Shard::Attachment& a : s.attached)
          if (a.file == k) return verify_tar(a.index, info.name, file);
      }
      if (s.layout == ShardLayout::kColumns) {
        const Column& c = s.columns[k];
        int64_t rows = shard_samples(shard);
        if (read_npy_header(file, c.raw, rows) != c.data_offset)
          throw Error(ErrorCode::kCorruptData,
                      "its data does not start where the manifest says (" +
                          std::to_string(c.data_offset) + ")",
                      info.name);
      }
      if (info.crc32c) {
        std::vector<uint8_t> chunk;
        uint32_t crc = 0;
        constexpr uint64_t kChunk = uint64_t{4} << 20;
        for (uint64_t at = 0; at < file.size(); at += kChunk) {
          file.read(at, std::min(kChunk, file.size() - at), chunk);
          crc = crc32c(chunk.data(), chunk.size(), crc);
        }
        if (crc != *info.crc32c)
          throw Error(ErrorCode::kCorruptData,
                      "CRC32C mismatch: not the file the manifest describes", info.name);
      }
      return;
    }
  }
  throw Error(ErrorCode::kInvalidArgument, "no data file " + std::to_string(entry));
}

std::shared_ptr<const io::ShardFile> Dataset::acquire_file(
    int64_t i, uint32_t file, const std::function<bool()>& keep_waiting) const {
  const Shard& s = shard_at(i);
  return gate_ ? gate_->acquire(s.files.at(file).gate_entry, keep_waiting) : s.open.at(file);
}

std::shared_ptr<const io::RowGroup> Dataset::acquire_rows(
    int64_t i, const std::function<bool()>& keep_waiting) const {
  const Shard& s = shard_at(i);
  STOKER_CHECK(s.layout == ShardLayout::kRowGroup && gate_, ErrorCode::kInternal,
               "not a row group's sample");
  return gate_->acquire_rows(s.files.at(0).gate_entry, keep_waiting);
}

std::shared_ptr<const io::ShardFile> Dataset::file(int64_t i, uint32_t file) const {
  const Shard& s = shard_at(i);
  if (!gate_) return s.open.at(file);
  auto open = gate_->peek(s.files.at(file).gate_entry);
  if (!open) throw Error(ErrorCode::kIO, "this file has not been fetched", s.files.at(file).name);
  return open;
}

const std::string& Dataset::shard_name(int64_t i) const { return shard_at(i).files.at(0).name; }

}  // namespace stoker::format
