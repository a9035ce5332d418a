// Writes one shard: the tar and its sidecar index. The files are written under temporary names and
// only renamed into place by finish(), so a shard that exists is complete.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "stoker/format/shard_index.h"

namespace stoker::format {

class ShardWriter {
 public:
  // `tar_path` and `index_path` are the final names. Throws Error(kIO).
  ShardWriter(std::string tar_path, std::string index_path);
  ~ShardWriter();  // an unfinished shard is deleted
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends KEY.<ext> with the image bytes and KEY.cls with the label (when label >= 0).
  void add(const std::string& key, ImageFormat format, const uint8_t* data, size_t size,
           int64_t label);
  uint64_t bytes_written() const { return offset_; }
  size_t num_samples() const { return index_.samples.size(); }
  // Writes the end-of-archive blocks and the index, fsyncs, renames both into place.
  void finish();

 private:
  void write(const void* data, size_t size);

  std::string tar_path_, index_path_;
  std::FILE* tar_ = nullptr;
  uint64_t offset_ = 0;
  ShardIndex index_;
  bool finished_ = false;
};

}  // namespace stoker::format
