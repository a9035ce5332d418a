#include "stoker/format/shard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/format/tar.h"

namespace stoker::format {

namespace {
std::string partial(const std::string& path) { return path + ".partial"; }

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
  index_.flags = kIndexFlagHasCrc;
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

void ShardWriter::add(const std::string& key, ImageFormat format, const uint8_t* data, size_t size,
                      int64_t label) {
  STOKER_CHECK(!finished_, ErrorCode::kInvalidArgument, "shard already finished");
  STOKER_CHECK(format != ImageFormat::kUnknown, ErrorCode::kInvalidArgument,
               "unknown image format for '" + key + "'");
  STOKER_CHECK(key.find('.') == std::string::npos && key.find('/') == std::string::npos,
               ErrorCode::kInvalidArgument, "a key may not contain '.' or '/': '" + key + "'");
  static const char zeros[kTarBlock] = {};
  const std::string image_name = key + "." + std::string(image_format_extension(format));
  const std::string header = make_tar_header(image_name, size);
  write(header.data(), header.size());
  SampleRecord r;
  r.offset = offset_;
  r.size = size;
  r.label = label;
  r.crc32c = crc32c(data, size);
  r.format = format;
  r.key = key;
  write(data, size);
  write(zeros, tar_padding(size));
  if (label >= 0) {
    const std::string text = std::to_string(label);
    const std::string cls = make_tar_header(key + ".cls", text.size());
    write(cls.data(), cls.size());
    write(text.data(), text.size());
    write(zeros, tar_padding(text.size()));
  }
  index_.samples.push_back(std::move(r));
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
  write_file_atomically(index_path_, serialize_shard_index(index_));
  finished_ = true;
}

}  // namespace stoker::format
