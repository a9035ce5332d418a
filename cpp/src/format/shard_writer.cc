#include "stoker/format/shard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/core/image_format.h"
#include "stoker/core/image_size.h"
#include "stoker/core/label.h"
#include "stoker/format/tar.h"

namespace stoker::format {

namespace {
std::string partial(const std::string& path) { return path + ".partial"; }

// make_tar_header's limit: the ustar name field (no prefix field, no long-name records).
constexpr size_t kMaxTarName = 100;

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = partial(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(ErrorCode::kIO, std::string("cannot create: ") + std::strerror(errno), tmp);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() &&
                  std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(ErrorCode::kIO, std::string("cannot write: ") + std::strerror(err), path);
  }
}
}  // namespace

ShardWriter::ShardWriter(std::string tar_path, std::string index_path)
    : tar_path_(std::move(tar_path)), index_path_(std::move(index_path)) {
  tar_ = std::fopen(partial(tar_path_).c_str(), "wb");
  if (!tar_)
    throw Error(ErrorCode::kIO, std::string("cannot create: ") + std::strerror(errno),
                partial(tar_path_));
}

ShardWriter::~ShardWriter() {
  if (tar_) std::fclose(tar_);
  if (!finished_) std::remove(partial(tar_path_).c_str());
}

void ShardWriter::write(const void* data, size_t size) {
  if (size && std::fwrite(data, 1, size, tar_) != size)
    throw Error(ErrorCode::kIO, std::string("write failed: ") + std::strerror(errno), tar_path_);
  offset_ += size;
}

void ShardWriter::add_sample(const std::string& key, std::span<const MemberData> members,
                             int64_t label) {
  STOKER_CHECK(!finished_, ErrorCode::kInvalidArgument, "shard already finished");
  STOKER_CHECK(
      !key.empty() && key.find('.') == std::string::npos && key.find('/') == std::string::npos,
      ErrorCode::kInvalidArgument, "a key must be non-empty, without '.' or '/': '" + key + "'");
  STOKER_CHECK(label >= -1, ErrorCode::kInvalidArgument, "a label must be >= 0 (or -1: none)");
  // Everything is checked before the first byte is written: a refused sample leaves no trace.
  STOKER_CHECK(!members.empty() || label >= 0, ErrorCode::kInvalidArgument,
               "sample '" + key + "' has no member and no label: nothing would be written");
  STOKER_CHECK(members.size() < kMaxMembersPerSample, ErrorCode::kInvalidArgument,
               "sample '" + key + "' has too many members");
  auto check_tar_name = [&](std::string_view name) {
    STOKER_CHECK(key.size() + 1 + name.size() <= kMaxTarName, ErrorCode::kInvalidArgument,
                 "tar member name over 100 bytes: '" + key + "." + std::string(name) + "'");
  };
  if (label >= 0) check_tar_name("cls");
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string_view name = members[i].name;
    STOKER_CHECK(!name.empty() && name.find('/') == std::string_view::npos && name.front() != '.',
                 ErrorCode::kInvalidArgument,
                 "member names are non-empty, without '/', and do not start with '.': '" +
                     std::string(name) + "' of '" + key + "'");
    check_tar_name(name);
    for (size_t j = 0; j < i; ++j)
      STOKER_CHECK(members[j].name != name, ErrorCode::kInvalidArgument,
                   "sample '" + key + "' has two members named '" + std::string(name) + "'");
    if (name == "cls") {
      std::optional<int64_t> parsed;
      try {
        parsed = parse_label(members[i].data, members[i].size);
      } catch (const Error& e) {
        throw Error(ErrorCode::kInvalidArgument, "member cls: " + e.reason(), tar_path_, key);
      }
      STOKER_CHECK(label < 0 || parsed == label, ErrorCode::kInvalidArgument,
                   "sample '" + key + "': its cls member and its label differ");
      label = parsed.value_or(-1);
    }
  }
  static const char zeros[kTarBlock] = {};
  auto append = [&](std::string_view name, const uint8_t* data, size_t size) {
    const std::string header = make_tar_header(key + "." + std::string(name), size);
    write(header.data(), header.size());
    // An image's width and height, from its header: what aspect buckets group by.
    ImageSize image_size;
    if (is_image_member_name(name)) {
      const ImageSizeResult r = read_image_size(data, size);
      if (r.status == ImageSizeStatus::kFound) image_size = r.size;
    }
    index_.add_member(name, offset_, size, crc32c(data, size), image_size);
    write(data, size);
    write(zeros, tar_padding(size));
  };
  index_.begin_sample(key, label);
  bool has_cls = false;
  for (const MemberData& m : members) {
    append(m.name, m.data, m.size);
    has_cls = has_cls || m.name == "cls";
  }
  if (label >= 0 && !has_cls) {
    const std::string text = std::to_string(label);
    append("cls", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }
}

void ShardWriter::add(const std::string& key, ImageFormat format, const uint8_t* data, size_t size,
                      int64_t label) {
  STOKER_CHECK(format != ImageFormat::kUnknown, ErrorCode::kInvalidArgument,
               "unknown image format for '" + key + "'");
  const MemberData image{image_format_extension(format), data, size};
  add_sample(key, {&image, 1}, label);
}

void ShardWriter::finish() {
  STOKER_CHECK(!finished_, ErrorCode::kInvalidArgument, "shard already finished");
  static const char zeros[2 * kTarBlock] = {};
  write(zeros, sizeof zeros);
  if (std::fflush(tar_) != 0 || ::fsync(fileno(tar_)) != 0)
    throw Error(ErrorCode::kIO, std::string("flush failed: ") + std::strerror(errno), tar_path_);
  std::fclose(tar_);
  tar_ = nullptr;
  if (std::rename(partial(tar_path_).c_str(), tar_path_.c_str()) != 0)
    throw Error(ErrorCode::kIO, std::string("rename failed: ") + std::strerror(errno), tar_path_);
  index_.index().flags = kIndexFlagHasCrc;
  write_file_atomically(index_path_, serialize_shard_index(index_.index()));
  finished_ = true;
}

size_t write_foreign_shard_index(const std::string& tar_path, const std::string& index_path) {
  const io::ShardFile tar(tar_path);
  const ShardIndex index = index_webdataset_tar(tar, /*with_crc=*/true);
  write_file_atomically(index_path, serialize_shard_index(index));
  return index.samples.size();
}

}  // namespace stoker::format
