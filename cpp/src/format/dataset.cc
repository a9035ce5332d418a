#include "stoker/format/dataset.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"

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

}  // namespace

void Dataset::add_shard(std::shared_ptr<const io::ShardFile> file, std::string name,
                        uint64_t bytes, ShardIndex index) {
  STOKER_CHECK(shards_.size() < UINT32_MAX, ErrorCode::kResourceLimit, "too many shards");
  const auto shard = static_cast<uint32_t>(shards_.size());
  for (size_t r = 0; r < index.samples.size(); ++r)
    locations_.push_back({shard, static_cast<uint32_t>(r)});
  has_crc_ = has_crc_ && (index.flags & kIndexFlagHasCrc);
  Shard s;
  s.name = std::move(name);
  s.bytes = bytes;
  s.file = std::move(file);
  s.index = std::move(index);
  shards_.push_back(std::move(s));
}

std::shared_ptr<const Dataset> Dataset::open(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    if (!ends_with(path, ".tar"))
      throw Error(ErrorCode::kInvalidArgument,
                  "expected a stoker pack folder, a .tar shard or a folder of .tar shards", path);
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

  return open_manifest(path, false);
}

std::shared_ptr<const Dataset> Dataset::open_fetched(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(fs::path(path) / kManifestName, ec))
    throw Error(ErrorCode::kIO, "no manifest.json in the cache folder", path);
  return open_manifest(path, true);
}

std::shared_ptr<Dataset> Dataset::open_manifest(const std::string& path, bool fetched) {
  const fs::path manifest_path = fs::path(path) / kManifestName;
  const std::vector<uint8_t> bytes = io::read_file(manifest_path.string());
  nlohmann::json m = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (m.is_discarded() || !m.is_object()) manifest_error(manifest_path, "not a JSON object");
  auto dataset = std::shared_ptr<Dataset>(new Dataset());
  dataset->path_ = path;
  try {
    if (m.at("format").get<std::string>() != "stoker-pack")
      manifest_error(manifest_path, "not a stoker pack");
    const auto version = manifest_count(m, "version", manifest_path, INT32_MAX);
    if (version < 1 || version > kPackFormatVersion)
      throw Error(ErrorCode::kUnsupported,
                  "pack format version " + std::to_string(version) + " (this stoker reads 1-" +
                      std::to_string(kPackFormatVersion) + ")",
                  manifest_path);
    dataset->classes_ = m.at("classes").get<std::vector<std::string>>();
    std::vector<std::string> names;
    std::vector<uint64_t> sizes;
    for (const auto& s : m.at("shards")) {
      const std::string tar = s.at("tar").get<std::string>();
      const std::string idx = s.at("index").get<std::string>();
      const auto expected = static_cast<uint64_t>(manifest_count(s, "num_samples", manifest_path));
      if (tar.find('/') != std::string::npos || idx.find('/') != std::string::npos)
        manifest_error(manifest_path, "shard names may not contain '/'");
      std::shared_ptr<const io::ShardFile> file;
      uint64_t tar_size = 0;
      if (fetched) {  // the shard arrives later: its size is the manifest's, checked on arrival
        if (!s.contains("bytes"))
          manifest_error(manifest_path, tar + " has no \"bytes\": a pack read from object "
                                              "storage needs each shard's size");
        tar_size = static_cast<uint64_t>(manifest_count(s, "bytes", manifest_path));
      } else {
        file = std::make_shared<const io::ShardFile>((fs::path(path) / tar).string());
        tar_size = file->size();
      }
      const std::vector<uint8_t> index_bytes = io::read_file((fs::path(path) / idx).string());
      ShardIndex index = parse_shard_index(index_bytes.data(), index_bytes.size(), tar_size, idx);
      if (index.samples.size() != expected)
        manifest_error(manifest_path, tar + " has " + std::to_string(index.samples.size()) +
                                          " samples, the manifest says " +
                                          std::to_string(expected));
      names.push_back(tar);
      sizes.push_back(tar_size);
      dataset->add_shard(std::move(file), tar, tar_size, std::move(index));
    }
    if (fetched) dataset->gate_ = std::make_shared<io::ShardGate>(names, sizes);
    const auto total = manifest_count(m, "num_samples", manifest_path);
    if (total != dataset->size())
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
    ShardIndex index = index_webdataset_tar(*file);
    const uint64_t bytes = file->size();
    dataset->add_shard(file, fs::path(p).filename().string(), bytes, std::move(index));
  }
  return dataset;
}

std::vector<std::shared_ptr<const io::ShardFile>> Dataset::open_files() const {
  std::vector<std::shared_ptr<const io::ShardFile>> out;
  out.reserve(shards_.size());
  for (uint32_t i = 0; i < shards_.size(); ++i) {
    auto file = gate_ ? gate_->peek(i) : shards_[i].file;
    if (file) out.push_back(std::move(file));
  }
  return out;
}

std::vector<Dataset::ShardCache> Dataset::page_cache() const {
  std::vector<ShardCache> out;
  for (const auto& f : open_files()) out.push_back({f->path(), f->size(), f->resident_bytes()});
  return out;
}

void Dataset::check_unchanged() const {
  for (const auto& f : open_files()) f->check_unchanged();
}

const SampleRecord& Dataset::record(int64_t i) const {
  const SampleLocation& l = locations_.at(static_cast<size_t>(i));
  return shards_[l.shard].index.samples[l.record];
}

std::span<const MemberRecord> Dataset::members(int64_t i) const {
  const SampleLocation& l = locations_.at(static_cast<size_t>(i));
  const ShardIndex& index = shards_[l.shard].index;
  return index.members_of(index.samples[l.record]);
}

void Dataset::verify_shard_file(uint32_t shard, const io::ShardFile& file) const {
  const Shard& s = shards_.at(shard);
  if (!(s.index.flags & kIndexFlagHasCrc)) return;
  std::vector<uint8_t> bytes;
  for (const SampleRecord& record : s.index.samples) {
    for (const MemberRecord& m : s.index.members_of(record)) {
      file.read(m.offset, m.size, bytes);
      if (crc32c(bytes.data(), bytes.size()) != m.crc32c)
        throw Error(ErrorCode::kCorruptData, "CRC32C mismatch: not the bytes the index describes",
                    s.name, record.key, s.index.member_names[m.name]);
    }
  }
}

std::shared_ptr<const io::ShardFile> Dataset::acquire_shard(
    int64_t i, const std::function<bool()>& keep_waiting) const {
  const uint32_t shard = locations_.at(static_cast<size_t>(i)).shard;
  return gate_ ? gate_->acquire(shard, keep_waiting) : shards_[shard].file;
}

std::shared_ptr<const io::ShardFile> Dataset::shard_file(int64_t i) const {
  const uint32_t shard = locations_.at(static_cast<size_t>(i)).shard;
  if (!gate_) return shards_[shard].file;
  auto file = gate_->peek(shard);
  if (!file) throw Error(ErrorCode::kIO, "this shard has not been fetched", shards_[shard].name);
  return file;
}

const std::string& Dataset::shard_name(int64_t i) const {
  return shards_[locations_.at(static_cast<size_t>(i)).shard].name;
}

}  // namespace stoker::format
