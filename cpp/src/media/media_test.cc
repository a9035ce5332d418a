// The media readers against files the ffmpeg command makes here (skipped where it is absent):
// a clip read from anywhere is the same frames as the whole video read in order, in every
// container; the frames are what the ffmpeg command decodes; audio windows are slices of the
// whole stream; sizes over the limits and broken files are errors, never crashes.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "media/yuv.h"
#include "stoker/core/error.h"
#include "stoker/fields/field.h"
#include "stoker/media/audio.h"
#include "stoker/media/plugin.h"
#include "stoker/media/video.h"

namespace stoker::media {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class Media : public ::testing::Test {
 protected:
  static fs::path dir() {
    static const fs::path d = [] {
      fs::path p = fs::temp_directory_path() / ("stoker-media-test-" + std::to_string(getpid()));
      fs::create_directories(p);
      return p;
    }();
    return d;
  }
  // `ffmpeg ARGS OUT` once per file name; false where there is no ffmpeg command.
  static bool make(const std::string& name, const std::string& args) {
    const fs::path out = dir() / name;
    if (fs::exists(out)) return true;
    const std::string cmd =
        "ffmpeg -nostdin -loglevel error -y " + args + " '" + out.string() + "' 2>/dev/null";
    return std::system(cmd.c_str()) == 0 && fs::exists(out);
  }
  static bool have_ffmpeg() { return std::system("ffmpeg -version >/dev/null 2>&1") == 0; }
  void SetUp() override {
    if (!have_ffmpeg()) GTEST_SKIP() << "no ffmpeg command";
  }
  // The files this process made (CTest runs each test in a process of its own).
  static void TearDownTestSuite() {
    std::error_code ignored;
    fs::remove_all(dir(), ignored);
  }
};

// 60 frames of a moving test pattern, 96x64, 25 fps, keyframes every 10, B-frames where the
// codec has them.
const std::string kPattern = "-f lavfi -i testsrc2=size=96x64:rate=25 -frames:v 60 -g 10 ";

struct Clip {
  std::string name, args;
};

const std::vector<Clip>& clips() {
  static const std::vector<Clip> c = {
      {"h264.mp4", kPattern + "-c:v libx264 -bf 2 -pix_fmt yuv420p"},
      {"h264-offset.mp4", kPattern + "-c:v libx264 -bf 2 -pix_fmt yuv420p -output_ts_offset 2.5"},
      {"h264.mkv", kPattern + "-c:v libx264 -bf 3 -pix_fmt yuv420p"},
      {"vp9.webm", kPattern + "-c:v libvpx-vp9 -deadline realtime -pix_fmt yuv420p"},
      {"mpeg4.avi", kPattern + "-c:v mpeg4 -bf 1"},
      // An MPEG program stream lists no streams in a header: they appear as their packets do,
      // here an audio stream's first (opened again, the reader must find the same ones).
      {"mpeg2.mpg", "-f lavfi -i sine=frequency=440:sample_rate=44100 " + kPattern +
                        "-map 1:v -map 0:a -t 2.4 -c:v mpeg2video -bf 2 -c:a mp2 -f mpeg"},
  };
  return c;
}

std::vector<std::vector<uint8_t>> all_frames(VideoReader& reader) {
  std::vector<std::vector<uint8_t>> out;
  reader.read_frames(0, reader.info().frames, 1, [&](const RgbFrame& f) {
    EXPECT_EQ(f.index, static_cast<int64_t>(out.size()));
    out.emplace_back(f.pixels, f.pixels + size_t(f.row_bytes) * size_t(f.height));
  });
  return out;
}

TEST_F(Media, AClipFromAnywhereIsTheWholeVideosFramesInEveryContainer) {
  for (const Clip& clip : clips()) {
    SCOPED_TRACE(clip.name);
    ASSERT_TRUE(make(clip.name, clip.args));
    const std::vector<uint8_t> bytes = read_file(dir() / clip.name);
    VideoReader reader(bytes);
    EXPECT_EQ(reader.info().frames, 60);
    EXPECT_EQ(reader.info().width, 96);
    EXPECT_EQ(reader.info().height, 64);
    EXPECT_NEAR(reader.info().frames_per_second, 25.0, 1e-6);
    const auto whole = all_frames(reader);
    ASSERT_EQ(whole.size(), 60u);
    // A moving pattern: a repeated frame is a bug (an MPEG program stream's keyframes carry no
    // time of their own until libavformat makes them from the next frames': without that, the
    // B-frames before each keyframe were timed a frame off and one of them shown twice).
    for (size_t k = 1; k < whole.size(); ++k) EXPECT_NE(whole[k - 1], whole[k]) << "frame " << k;
    struct Ask {
      int64_t first, count, stride;
    };
    for (Ask ask : {Ask{0, 4, 1}, Ask{7, 5, 3}, Ask{23, 8, 2}, Ask{59, 1, 1}, Ask{10, 16, 3},
                    Ask{31, 3, 9}, Ask{9, 2, 1}, Ask{0, 1, 1}}) {
      VideoReader fresh(bytes);  // and the same reader again, after other reads
      for (VideoReader* r : {&fresh, &reader}) {
        int64_t k = 0;
        r->read_frames(ask.first, ask.count, ask.stride, [&](const RgbFrame& f) {
          const int64_t index = ask.first + k * ask.stride;
          ASSERT_EQ(f.index, index);
          EXPECT_NEAR(f.seconds, static_cast<double>(index) / 25.0, 1e-6);
          const std::vector<uint8_t> got(f.pixels, f.pixels + size_t(f.row_bytes) * f.height);
          EXPECT_TRUE(got == whole[size_t(index)]) << "frame " << index;
          ++k;
        });
        EXPECT_EQ(k, ask.count);
      }
    }
  }
}

TEST_F(Media, FramesAnEditListCutsAreNoFramesOfTheVideo) {
  // A stream copy from 0.5 s: the mp4 keeps the GOP from the keyframe at 0.4 s and an edit list
  // that cuts frames 10-12 (their packets are flagged to be decoded, never shown).
  ASSERT_TRUE(make("h264.mp4", clips()[0].args));
  ASSERT_TRUE(
      make("h264-edit-list.mp4", "-ss 0.5 -i '" + (dir() / "h264.mp4").string() + "' -c copy"));
  const std::vector<uint8_t> original = read_file(dir() / "h264.mp4");
  const std::vector<uint8_t> cut = read_file(dir() / "h264-edit-list.mp4");
  VideoReader whole(original), reader(cut);
  ASSERT_EQ(reader.info().frames, 47);
  EXPECT_NEAR(reader.frame_seconds(0), 0.0, 1e-9);
  const auto frames = all_frames(reader);
  const auto originals = all_frames(whole);
  ASSERT_EQ(frames.size(), 47u);
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_TRUE(frames[i] == originals[i + 13]) << "frame " << i;  // frame 13 on
  }
  int64_t k = 0;
  reader.read_frames(5, 4, 3, [&](const RgbFrame& f) {
    EXPECT_EQ(f.index, 5 + 3 * k);
    EXPECT_TRUE(std::vector<uint8_t>(f.pixels, f.pixels + size_t(f.row_bytes) * f.height) ==
                frames[size_t(f.index)]);
    ++k;
  });
  EXPECT_EQ(k, 4);
}

// BT.601 limited range in double precision, each chroma sample centred on its 2x2 luma pixels
// (bilinear weights 3/4, 1/4, the edges repeated), truncated: what yuv_to_rgb computes.
std::vector<uint8_t> reference_rgb(const uint8_t* yuv, int w, int h) {
  const uint8_t* Y = yuv;
  const uint8_t* U = yuv + w * h;
  const uint8_t* V = U + (w / 2) * (h / 2);
  auto chroma = [&](const uint8_t* c, int x, int y) {
    const double cx = (x - 0.5) / 2, cy = (y - 0.5) / 2;
    const int x0 = int(std::floor(cx)), y0 = int(std::floor(cy));
    const double fx = cx - x0, fy = cy - y0;
    auto at = [&](int i, int j) {
      return double(c[std::clamp(j, 0, h / 2 - 1) * (w / 2) + std::clamp(i, 0, w / 2 - 1)]);
    };
    return (1 - fy) * ((1 - fx) * at(x0, y0) + fx * at(x0 + 1, y0)) +
           fy * ((1 - fx) * at(x0, y0 + 1) + fx * at(x0 + 1, y0 + 1));
  };
  std::vector<uint8_t> out(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const double l = (Y[y * w + x] - 16) * 255.0 / 219.0;
      const double u = (chroma(U, x, y) - 128) * 255.0 / 224.0;
      const double v = (chroma(V, x, y) - 128) * 255.0 / 224.0;
      const double rgb[3] = {l + 1.402 * v, l - 0.344136 * u - 0.714136 * v, l + 1.772 * u};
      for (int k = 0; k < 3; ++k)
        out[(size_t(y) * w + x) * 3 + k] = uint8_t(std::clamp(std::floor(rgb[k]), 0.0, 255.0));
    }
  return out;
}

// The decoded pictures are the ffmpeg command's, to the byte (its yuv420p output), and their
// RGB is BT.601's formula on them (within one level: fixed point against double).
TEST_F(Media, FramesAreWhatTheFfmpegCommandDecodes) {
  ASSERT_TRUE(make("h264.mp4", clips()[0].args));
  const fs::path raw = dir() / "h264.yuv";
  const std::string cmd = "ffmpeg -nostdin -loglevel error -y -i '" +
                          (dir() / "h264.mp4").string() + "' -f rawvideo -pix_fmt yuv420p '" +
                          raw.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::vector<uint8_t> yuv = read_file(raw);
  const size_t yuv_bytes = 96 * 64 * 3 / 2;
  ASSERT_EQ(yuv.size(), yuv_bytes * 60);
  const std::vector<uint8_t> bytes = read_file(dir() / "h264.mp4");
  VideoReader reader(bytes);
  const auto whole = all_frames(reader);
  ASSERT_EQ(whole.size(), 60u);
  for (size_t i = 0; i < whole.size(); ++i) {
    const std::vector<uint8_t> want = reference_rgb(yuv.data() + i * yuv_bytes, 96, 64);
    int worst = 0;
    for (size_t k = 0; k < want.size(); ++k)
      worst = std::max(worst, std::abs(whole[i][k] - want[k]));
    EXPECT_LE(worst, 1) << "frame " << i;
  }
  // A region: its pixels are the whole frame's.
  FrameRegion region{10, 7, 61, 40};
  reader.read_frames(
      20, 1, 1,
      [&](const RgbFrame& f) {
        for (int y = region.y0; y < region.y1; ++y)
          for (int x = region.x0; x < region.x1; ++x)
            for (int k = 0; k < 3; ++k)
              ASSERT_EQ(f.pixels[size_t(y) * f.row_bytes + x * 3 + k],
                        whole[20][(size_t(y) * 96 + x) * 3 + k]);
      },
      region);
}

// The AVX2 conversion gives the portable loop's bytes: every subsampling, both matrices and
// ranges, regions starting and ending anywhere (the 16-pixel steps and the tail), values at
// the clamps (random planes reach them).
TEST(Yuv, TheVectorConversionIsThePortableOneToTheByte) {
  uint32_t seed = 12345;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
  for (int trial = 0; trial < 300; ++trial) {
    const int w = 1 + int(next() % 90), h = 1 + int(next() % 9);
    const int sx = int(next() % 2), sy = sx ? int(next() % 2) : 0;
    const int cw = (w + sx) >> sx, ch = (h + sy) >> sy;
    std::vector<uint8_t> Y(size_t(w) * h), U(size_t(cw) * ch), V(size_t(cw) * ch);
    for (auto* plane : {&Y, &U, &V})
      for (auto& b : *plane) b = uint8_t(next() >> 24);
    const detail::YuvPlanes planes{Y.data(), U.data(), V.data(), w, cw, cw, w, h, sx, sy};
    const detail::YuvMatrix m = detail::yuv_matrix(next() % 2, next() % 2);
    const int x0 = int(next() % w), x1 = x0 + 1 + int(next() % (w - x0));
    const int y0 = int(next() % h), y1 = y0 + 1 + int(next() % (h - y0));
    std::vector<uint8_t> fast(size_t(w) * h * 3, 7), portable(fast);
    detail::yuv_to_rgb(planes, m, x0, y0, x1, y1, fast.data(), w * 3);
    detail::set_portable_yuv_for_testing(true);
    detail::yuv_to_rgb(planes, m, x0, y0, x1, y1, portable.data(), w * 3);
    detail::set_portable_yuv_for_testing(false);
    ASSERT_TRUE(fast == portable) << w << "x" << h << " shifts " << sx << sy << " region " << x0
                                  << "," << y0 << "-" << x1 << "," << y1;
  }
}

TEST_F(Media, SizesOverTheLimitsAreRefusedBeforeDecoding) {
  ASSERT_TRUE(make("h264.mp4", clips()[0].args));
  const std::vector<uint8_t> bytes = read_file(dir() / "h264.mp4");
  MediaLimits small;
  small.max_pixels = 96 * 63;
  try {
    VideoReader reader(bytes, small);
    FAIL() << "expected a ResourceLimit error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceLimit);
    EXPECT_NE(e.reason().find("96x64"), std::string::npos) << e.reason();
  }
  MediaLimits few;
  few.max_frames = 59;
  EXPECT_THROW({ VideoReader r(bytes, few); }, Error);
  MediaLimits brief;
  brief.max_seconds = 1.0;
  EXPECT_THROW({ VideoReader r(bytes, brief); }, Error);
  // One frame decoded at most: frame 0 (a keyframe) reads, frame 1 (decoded after it) does not.
  MediaLimits one;
  one.max_decoded_frames = 1;
  VideoReader capped(bytes, one);
  int64_t got = 0;
  capped.read_frames(0, 1, 1, [&](const RgbFrame&) { ++got; });
  EXPECT_EQ(got, 1);
  try {
    capped.read_frames(1, 1, 1, [](const RgbFrame&) {});
    FAIL() << "expected a ResourceLimit error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceLimit);
    EXPECT_NE(e.reason().find("max_decoded_frames"), std::string::npos) << e.reason();
  }
  VideoReader reader(bytes);
  EXPECT_THROW(reader.read_frames(58, 2, 2, [](const RgbFrame&) {}), Error);  // past the end
  EXPECT_THROW(reader.read_frames(0, 0, 1, [](const RgbFrame&) {}), Error);
}

TEST_F(Media, BrokenFilesAreErrorsNamingTheReason) {
  ASSERT_TRUE(make("h264.mp4", clips()[0].args));
  ASSERT_TRUE(make("h264-fast.mp4", clips()[0].args + " -movflags +faststart"));
  const std::vector<uint8_t> garbage(4096, 0x5a);
  try {
    VideoReader reader(garbage);
    FAIL() << "garbage opened";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::kCorruptData || e.code() == ErrorCode::kUnsupported);
    EXPECT_FALSE(e.reason().empty());
  }
  for (const char* name : {"h264.mp4", "h264-fast.mp4"}) {
    std::vector<uint8_t> bytes = read_file(dir() / name);
    for (double keep : {0.1, 0.5, 0.9}) {
      std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(double(bytes.size()) * keep));
      try {
        VideoReader reader(cut);
        reader.read_frames(0, reader.info().frames, 1, [](const RgbFrame&) {});
      } catch (const Error&) {
        // a clear error; what a truncated file must not do is crash or hang
      }
    }
    // Bytes flipped in the middle: an error or frames, never a crash.
    for (size_t i = bytes.size() / 3; i < bytes.size() / 3 + 200; ++i) bytes[i] ^= 0xff;
    try {
      VideoReader reader(bytes);
      reader.read_frames(0, reader.info().frames, 1, [](const RgbFrame&) {});
    } catch (const Error&) {
    }
  }
  std::vector<uint8_t> no_video;
  ASSERT_TRUE(make("tone.wav", "-f lavfi -i sine=frequency=440:sample_rate=8000 -t 0.5"));
  no_video = read_file(dir() / "tone.wav");
  try {
    VideoReader reader(no_video);
    FAIL() << "a wav opened as video";
  } catch (const Error& e) {
    EXPECT_NE(e.reason().find("no video stream"), std::string::npos) << e.reason();
  }
}

// 2.5 s of two tones (440 Hz left, 1 kHz right) at 44.1 kHz.
const std::string kTones =
    "-f lavfi -i sine=frequency=440:sample_rate=44100:duration=2.5 -f lavfi -i "
    "sine=frequency=1000:sample_rate=44100:duration=2.5 -filter_complex amerge=inputs=2 ";

TEST_F(Media, AudioWindowsAreSlicesOfTheWholeStream) {
  ASSERT_TRUE(make("tones.wav", kTones + "-c:a pcm_s16le"));
  ASSERT_TRUE(make("tones.flac", kTones + "-c:a flac"));
  ASSERT_TRUE(make("tones.mp3", kTones + "-c:a libmp3lame -b:a 192k"));
  const std::vector<uint8_t> wav = read_file(dir() / "tones.wav");
  AudioReader wav_reader(wav);
  EXPECT_EQ(wav_reader.info().sample_rate, 44100);
  EXPECT_EQ(wav_reader.info().channels, 2);
  std::vector<float> whole;
  ASSERT_EQ(wav_reader.read(0, -1, 0, 0, whole), 110250);
  // The wav's own samples, as 16-bit values / 32768 (what soundfile gives as float32).
  const size_t data = wav.size() - 110250 * 4;  // the header's bytes: the rest is the data
  for (size_t i = 0; i < 110250; i += 997) {
    for (size_t c = 0; c < 2; ++c) {
      const auto v =
          static_cast<int16_t>(wav[data + 4 * i + 2 * c] | (wav[data + 4 * i + 2 * c + 1] << 8));
      ASSERT_EQ(whole[c * 110250 + i], static_cast<float>(v) / 32768.0f) << i;
    }
  }
  for (const char* name : {"tones.wav", "tones.flac", "tones.mp3"}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> bytes = read_file(dir() / name);
    AudioReader reader(bytes);
    std::vector<float> all;
    const int64_t n = reader.read(0, -1, 0, 0, all);
    if (std::string(name) != "tones.mp3") {  // lossless: the same samples
      ASSERT_EQ(n, 110250);
      EXPECT_EQ(all, whole);
    } else {  // gapless: the encoder's delay and padding left out, within a frame
      EXPECT_NEAR(static_cast<double>(n), 110250.0, 1152.0);
    }
    for (int64_t first : {0, 11025, 44100, 74970}) {
      std::vector<float> window;
      const int64_t got = reader.read(first, 22050, 0, 0, window);
      ASSERT_EQ(got, 22050);
      float worst = 0;
      for (int64_t c = 0; c < 2; ++c) {
        for (int64_t i = 0; i < got; ++i) {
          worst = std::max(worst,
                           std::abs(window[size_t(c * got + i)] - all[size_t(c * n + first + i)]));
        }
      }
      EXPECT_LE(worst, 1e-6f) << "window at " << first;
    }
    // Past the end: what there is.
    std::vector<float> tail;
    EXPECT_EQ(reader.read(99225, 44100, 0, 0, tail), n - 99225);
  }
}

// A resampled window is the whole stream resampled and then cut, wherever it starts: it starts
// on the output rate's grid, and the samples the resampler's filter reaches on both sides of it
// go through the resampler with it. Down (44.1 kHz to 16 kHz, where the grids meet every 441
// input samples) and up (to 48 kHz), mono and stereo, a PCM wav (read directly) and an mp3
// (through FFmpeg, from a seek).
TEST_F(Media, ResampledWindowsAreTheWholeStreamResampledThenCut) {
  ASSERT_TRUE(make("tones.wav", kTones + "-c:a pcm_s16le"));
  ASSERT_TRUE(make("tones.mp3", kTones + "-c:a libmp3lame -b:a 192k"));
  for (const char* name : {"tones.wav", "tones.mp3"}) {
    const std::vector<uint8_t> bytes = read_file(dir() / name);
    AudioReader reader(bytes);
    for (const auto& [rate, channels] : {std::pair{16000, 1}, std::pair{48000, 0}}) {
      SCOPED_TRACE(std::string(name) + " at " + std::to_string(rate));
      std::vector<float> whole, native;
      const int64_t n = reader.read(0, -1, rate, channels, whole);
      EXPECT_EQ(n, resampled_frames(reader.read(0, -1, 0, channels, native), 44100, rate));
      const int64_t planes = channels == 1 ? 1 : 2, count = rate / 4;
      for (int64_t first :
           {int64_t{0}, int64_t{1}, int64_t{4001}, (n - count) / 2, n - count, n - count / 2}) {
        std::vector<float> window;
        const int64_t got = reader.read(first, count, rate, channels, window);
        ASSERT_EQ(got, std::min(count, n - first)) << first;
        float worst = 0;
        for (int64_t c = 0; c < planes; ++c) {
          for (int64_t i = 0; i < got; ++i) {
            worst = std::max(
                worst, std::abs(window[size_t(c * got + i)] - whole[size_t(c * n + first + i)]));
          }
        }
        EXPECT_LE(worst, 1e-5f) << "window at " << first;
      }
    }
  }
}

TEST_F(Media, AudioIsMixedDownAndResampledKeepingItsTone) {
  ASSERT_TRUE(make("tones.wav", kTones + "-c:a pcm_s16le"));
  const std::vector<uint8_t> bytes = read_file(dir() / "tones.wav");
  AudioReader reader(bytes);
  std::vector<float> stereo, mono, resampled;
  const int64_t n = reader.read(22050, 44100, 0, 0, stereo);
  ASSERT_EQ(reader.read(22050, 44100, 0, 1, mono), n);
  for (int64_t i = 0; i < n; i += 101) {
    EXPECT_FLOAT_EQ(mono[size_t(i)], (stereo[size_t(i)] + stereo[size_t(n + i)]) / 2);
  }
  // 44.1 kHz -> 16 kHz, from 0.5 s: the 440 Hz tone kept (its correlation with a 440 Hz sine
  // of the same phase, away from the edges).
  const int64_t m = reader.read(8000, 16000, 16000, 1, resampled);
  EXPECT_EQ(m, 16000);
  double left = 0, energy = 0;
  for (int64_t i = 800; i < m - 800; ++i) {
    const double t = 0.5 + static_cast<double>(i) / 16000;
    const double s = std::sin(2 * M_PI * 440 * t);
    left += resampled[size_t(i)] * s;
    energy += s * s;
  }
  // the mean of a 440 Hz tone of amplitude 1/8 (ffmpeg's sine) and a 1 kHz one: 1/16 of it.
  EXPECT_NEAR(left / energy, 0.0625, 0.002);
  // A float wav holding a NaN: an error, not a NaN handed on.
  std::vector<uint8_t> f32;
  ASSERT_TRUE(make("tone-f32.wav",
                   "-f lavfi -i sine=frequency=440:sample_rate=8000:duration=0.2 -c:a pcm_f32le"));
  f32 = read_file(dir() / "tone-f32.wav");
  const float nan = std::nanf("");
  std::memcpy(f32.data() + f32.size() - 400, &nan, sizeof nan);  // a sample near the end
  AudioReader poisoned(f32);
  try {
    std::vector<float> out;
    poisoned.read(0, -1, 0, 0, out);
    FAIL() << "a NaN sample was handed on";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_NE(e.reason().find("not finite"), std::string::npos) << e.reason();
  }
  MediaLimits slow;
  slow.max_sample_rate = 22050;
  EXPECT_THROW({ AudioReader r(bytes, slow); }, Error);
  EXPECT_THROW(reader.read(-1, 1, 0, 0, stereo), Error);
  EXPECT_THROW(reader.read(0, 1, 0, 3, stereo), Error);
}

// The plugin table (core/media_plugin.h): errors come back as codes and reasons, never as
// exceptions across the boundary, and a sink that says stop ends the read with its reason.
TEST_F(Media, ThePluginAnswersInCodesAndStopsWhenItsSinkSaysSo) {
  const StokerMediaPlugin& p = *plugin();
  EXPECT_EQ(p.version, STOKER_MEDIA_PLUGIN_VERSION);
  char reason[256] = {};
  void* handle = reinterpret_cast<void*>(1);
  StokerVideoInfo info{};
  const std::vector<uint8_t> junk(4096, 0);
  EXPECT_EQ(p.video_open(junk.data(), junk.size(), nullptr, &handle, &info, reason, sizeof reason),
            static_cast<int>(ErrorCode::kCorruptData));
  EXPECT_EQ(handle, nullptr);
  EXPECT_NE(std::string(reason).find("not a media container"), std::string::npos) << reason;

  ASSERT_TRUE(make(clips()[0].name, clips()[0].args));
  const std::vector<uint8_t> bytes = read_file(dir() / clips()[0].name);
  ASSERT_EQ(
      p.video_open(bytes.data(), bytes.size(), nullptr, &handle, &info, reason, sizeof reason), 0);
  EXPECT_EQ(info.frames, 60);
  struct Seen {
    std::vector<int64_t> indices;
  } seen;
  auto sink = [](void* context, int64_t index, double, const uint8_t* rgb, int32_t width,
                 int32_t height, char* error, size_t error_size) -> int {
    auto* s = static_cast<Seen*>(context);
    EXPECT_EQ(width, 96);
    EXPECT_EQ(height, 64);
    EXPECT_NE(rgb, nullptr);
    s->indices.push_back(index);
    if (s->indices.size() < 3) return 0;
    std::snprintf(error, error_size, "enough");
    return static_cast<int>(ErrorCode::kResourceLimit);
  };
  EXPECT_EQ(p.video_read(handle, 12, 5, 2, nullptr, sink, &seen, reason, sizeof reason),
            static_cast<int>(ErrorCode::kResourceLimit));
  EXPECT_EQ(seen.indices, (std::vector<int64_t>{12, 14, 16}));
  EXPECT_STREQ(reason, "enough");
  p.video_close(handle);
}

// A Video field over the plugin: a clip's frames, their times and its length, a looped short
// clip, a skipped one.
TEST_F(Media, AVideoFieldRendersAClipThroughThePlugin) {
  fields::install_media_plugin(plugin());
  ASSERT_TRUE(make(clips()[0].name, clips()[0].args));
  const std::vector<uint8_t> bytes = read_file(dir() / clips()[0].name);
  auto field = [](int frames, int stride, fields::ShortClip short_clip) {
    fields::FieldSpec s;
    s.name = "clip";
    s.kind = fields::FieldKind::kVideo;
    s.member = "mp4";
    s.video.frames = frames;
    s.video.stride = stride;
    s.video.height = 32;
    s.video.width = 48;
    s.video.geometry.kind = fields::GeometryKind::kResize;
    s.video.start = fields::MediaStart::kStart;
    s.video.short_clip = short_clip;
    return fields::FieldSet({s});
  };
  auto decode = [&](const fields::FieldSet& set, std::vector<uint8_t>& pixels,
                    std::vector<double>& times, int64_t& length) {
    pixels.assign(set.outputs()[0].sample_bytes, 7);
    times.assign(set.outputs()[1].sample_bytes / sizeof(double), 0.0);
    uint8_t* out[] = {pixels.data(), reinterpret_cast<uint8_t*>(times.data()),
                      reinterpret_cast<uint8_t*>(&length)};
    fields::SampleContext context;
    fields::Geometry geometry;
    fields::FieldTimes field_times;
    set.make_decoder(0)->decode(bytes.data(), bytes.size(), context, geometry, out, nullptr,
                                field_times);
  };
  std::vector<uint8_t> pixels;
  std::vector<double> times;
  int64_t length = 0;
  const fields::FieldSet clip = field(4, 5, fields::ShortClip::kLoop);
  decode(clip, pixels, times, length);
  EXPECT_EQ(length, 4);
  EXPECT_EQ(times, (std::vector<double>{0.0, 0.2, 0.4, 0.6}));
  const size_t frame = 32 * 48 * 3;
  EXPECT_NE(std::vector<uint8_t>(pixels.begin(), pixels.begin() + frame),
            std::vector<uint8_t>(pixels.begin() + frame, pixels.begin() + 2 * frame));

  const fields::FieldSet looped = field(8, 10, fields::ShortClip::kLoop);  // spans 71 of 60
  decode(looped, pixels, times, length);
  EXPECT_EQ(times, (std::vector<double>{0.0, 0.4, 0.8, 1.2, 1.6, 2.0, 0.0, 0.4}));
  EXPECT_TRUE(std::equal(pixels.begin(), pixels.begin() + 2 * frame, pixels.begin() + 6 * frame));

  EXPECT_THROW(decode(field(8, 10, fields::ShortClip::kSkip), pixels, times, length),
               fields::SkipSample);
}

}  // namespace
}  // namespace stoker::media
