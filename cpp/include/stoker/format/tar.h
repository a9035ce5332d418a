// The subset of POSIX ustar that WebDataset shards use: regular files, GNU long names and pax
// 'path' records. Writer and reader of tar headers; nothing else about the pack lives here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "stoker/io/shard_file.h"

namespace stoker::format {

inline constexpr uint64_t kTarBlock = 512;

// One 512-byte ustar header for a regular file. Names must be at most 100 bytes.
std::string make_tar_header(std::string_view name, uint64_t size);
// Zero bytes that pad a member of `size` bytes to a block boundary.
inline uint64_t tar_padding(uint64_t size) { return (kTarBlock - size % kTarBlock) % kTarBlock; }

struct TarMember {
  std::string name;     // full path inside the archive
  uint64_t offset = 0;  // of the data, from the start of the archive
  uint64_t size = 0;
};

// Calls `visit` for every regular file in the archive, in order. Reads headers only.
// Throws Error(kCorruptData) naming the shard on a bad checksum, a member running past the end of
// the file, or a malformed size field.
void scan_tar(const io::ShardFile& file, const std::function<void(const TarMember&)>& visit);

// WebDataset's split of a member name into key and extension: the key is the path up to the first
// dot of the last path component; the extension is the rest, lower-cased.
void split_webdataset_name(std::string_view name, std::string& key, std::string& extension);

}  // namespace stoker::format
