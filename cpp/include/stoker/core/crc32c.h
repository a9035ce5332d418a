// CRC32C (Castagnoli), the checksum stored per sample in a shard index.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

// Extends `crc` (0 to start) over `size` bytes. Uses SSE4.2 when the CPU has it.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace stoker
