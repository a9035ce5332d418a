// Writes one shard: the tar and its sidecar index. The files are written under temporary names and
// only renamed into place by finish(), so a shard that exists is complete.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "stoker/core/image_format.h"
#include "stoker/format/shard_index.h"

namespace stoker::format {

class ShardWriter {
 public:
  // `tar_path` and `index_path` are the final names. Throws Error(kIO).
  ShardWriter(std::string tar_path, std::string index_path);
  ~ShardWriter();  // an unfinished shard is deleted
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  struct MemberData {
    std::string_view name;  // KEY.<name> in the tar: "jpg", "seg.png", "boxes.npy"
    const uint8_t* data = nullptr;
    size_t size = 0;
  };
  // Appends KEY.<name> for every member, in order, and KEY.cls with the label when label >= 0
  // and no member is named "cls". A "cls" member must hold a decimal label (it becomes the
  // sample's label in the index). Throws Error(kInvalidArgument) for a bad key or member name.
  void add_sample(const std::string& key, std::span<const MemberData> members, int64_t label = -1);
  // One image (KEY.jpg / KEY.png / KEY.webp) and its label: add_sample with one member.
  void add(const std::string& key, ImageFormat format, const uint8_t* data, size_t size,
           int64_t label);
  uint64_t bytes_written() const { return offset_; }
  size_t num_samples() const { return index_.index().samples.size(); }
  // Writes the end-of-archive blocks and the index, fsyncs, renames both into place.
  void finish();

 private:
  void write(const void* data, size_t size);

  std::string tar_path_, index_path_;
  std::FILE* tar_ = nullptr;
  uint64_t offset_ = 0;
  ShardIndexBuilder index_;
  bool finished_ = false;
};

// Writes the sidecar index of a WebDataset tar that stoker did not write, with every member's
// CRC32C (index_webdataset_tar), to `index_path` by rename. Returns its number of samples.
// Throws Error(kCorruptData) for a tar that is not one, Error(kIO).
size_t write_foreign_shard_index(const std::string& tar_path, const std::string& index_path);

}  // namespace stoker::format
