#pragma once

// PCM WAV read directly, without FFmpeg: a sound packed with `--audio-rate` (16-bit PCM) is a
// window of samples to convert, and FFmpeg's open of a wav costs more than reading it (its
// demuxer probes the first 64 kB for a compressed stream inside: 0.9 ms to open, 0.4 ms to read
// 4 s of 16 kHz). Every size in the header is untrusted; anything but plain PCM (ADPCM, A-law,
// an odd block size) is left to FFmpeg.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace stoker::media::detail {

struct PcmWav {
  int sample_rate = 0;
  int channels = 0;
  int bits = 0;           // 8 (unsigned), 16, 24, 32 (signed); 32 or 64 when floating
  bool floating = false;  // IEEE float samples
  size_t data_offset = 0;
  int64_t frames = 0;  // whole frames in the data chunk (cut where the file ends)
  std::string codec;   // FFmpeg's name for it: pcm_s16le, pcm_f32le, ...
};

// The header of a plain PCM WAV, or nothing (another file, or a WAV FFmpeg should read).
std::optional<PcmWav> parse_pcm_wav(std::span<const uint8_t> bytes);

// Frames [first, first + count) (count < 0: to the end; cut at the end), as float32 planes in
// [-1, 1] converted as FFmpeg converts them (x / 2^(bits - 1)).
void read_pcm_wav(const PcmWav& wav, std::span<const uint8_t> bytes, int64_t first, int64_t count,
                  std::vector<std::vector<float>>& planes);

}  // namespace stoker::media::detail
