// The sidecar index of one shard: where each sample's image lies in the tar, its label and CRC32C.
// Binary, little-endian, versioned; specified in docs/FORMAT.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stoker/core/image_format.h"
#include "stoker/io/shard_file.h"

namespace stoker::format {

inline constexpr char kIndexMagic[8] = {'S', 'T', 'K', 'R', 'I', 'D', 'X', '\0'};
inline constexpr uint32_t kIndexVersion = 1;
inline constexpr uint32_t kIndexRecordSize = 40;
inline constexpr uint32_t kIndexFlagHasCrc = 1;

struct SampleRecord {
  uint64_t offset = 0;  // of the image bytes in the tar
  uint64_t size = 0;
  int64_t label = -1;   // -1: none
  uint32_t crc32c = 0;  // of the image bytes (valid when the index has kIndexFlagHasCrc)
  ImageFormat format = ImageFormat::kUnknown;
  std::string key;
};

struct ShardIndex {
  uint32_t flags = 0;
  std::vector<SampleRecord> samples;
};

std::string serialize_shard_index(const ShardIndex& index);
// Parses and validates an index. `shard_size` bounds every offset; `name` is used in errors.
ShardIndex parse_shard_index(const uint8_t* data, size_t size, uint64_t shard_size,
                             const std::string& name);

// Builds an index for a WebDataset tar that stoker did not write: one sample per key that has a
// .jpg/.jpeg/.png member; the label from its .cls member if any. No CRCs.
ShardIndex index_webdataset_tar(const io::ShardFile& file);

}  // namespace stoker::format
