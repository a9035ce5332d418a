// Fuzz target: one sample's decode + crop + resize, the path every loader worker runs
// (SampleProcessor::process), and a full decode (ImageDecoder::decode_full, as stoker.pack and
// decode_image run it).
//
// Input: kParamBytes of options, then the image file (JPEG, PNG or anything else):
//   [0] bit 0 train, 1 no DCT scaling, 2 no restart-marker ROI, 3 exact progressive
//       (no progressive shortcut), 4 fast upsampling, 5 skip the full decode,
//       bits 6-7 RandomResizedCrop scale/ratio preset
//   [1..2] output size - 1 (mod 512), little-endian
//   [3..4] eval resize size: 0 for the default, else size + value - 1
//   [5..6] sample index   [7] seed (low 4 bits) and epoch (high 4 bits)
//
// Beyond "no crash": the output of a sample depends only on (seed, epoch, index), so processing
// it twice on the same processor gives the same pixels, or the same error, whatever the first
// call left behind in the decoder; a full decode has exactly the size its header announced, and
// a file that decodes whole starts (ImageDecoder::starts, asked first on the same decoder: what
// decode="gpu" asks before handing a file to the device never keeps a decodable one back).
//
// The pixel limit is stoker's own (kMaxPixels), far below the fuzzer's -rss_limit_mb: a
// decompression bomb must be stopped by DecodeOptions, not by libFuzzer.
#include <optional>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"
#include "stoker/pipeline/sample_processor.h"

using namespace stoker;

namespace {

constexpr size_t kParamBytes = 8;
constexpr int64_t kMaxPixels = int64_t{1} << 22;  // 4 MP: at most ~50 MB of decoder memory

struct Params {
  pipeline::TransformOptions transform;
  decode::DecodeOptions decode;
  uint64_t seed = 0;
  int64_t epoch = 0, index = 0;
  bool full_decode = true;
};

Params read_params(const uint8_t* p) {
  Params params;
  const uint8_t flags = p[0];
  params.transform.train = flags & 1;
  params.transform.allow_dct_scaling = !(flags & 2);
  params.decode.restart_roi = !(flags & 4);
  params.decode.progressive_shortcut = !(flags & 8);
  params.decode.fast_upsampling = flags & 16;  // the fast paths, together
  params.decode.fast_idct = flags & 16;
  params.full_decode = !(flags & 32);
  switch (flags >> 6) {  // the presets a user may pass as scale= and ratio=
    case 1:              // the whole image, any aspect
      params.transform.crop = {1.0, 1.0, 1.0, 1.0, 10};
      break;
    case 2:  // tiny crops: heavy upscaling
      params.transform.crop = {1e-4, 1e-3, 3.0 / 4.0, 4.0 / 3.0, 10};
      break;
    case 3:  // absurd but accepted aspect ratios: the draws fail, the centre crop remains
      params.transform.crop = {0.08, 1.0, 1e-20, 1e20, 10};
      break;
    default: break;
  }
  params.transform.size = 1 + (p[1] | p[2] << 8) % 512;
  const int resize = p[3] | p[4] << 8;
  params.transform.resize_size = resize == 0 ? 0 : params.transform.size + resize - 1;
  params.index = p[5] | p[6] << 8;
  params.seed = p[7] & 15;
  params.epoch = p[7] >> 4;
  params.decode.max_pixels = kMaxPixels;
  return params;
}

// The sample's pixels, or the code of the error it raised.
struct Outcome {
  std::vector<uint8_t> pixels;
  std::optional<ErrorCode> error;
};

Outcome process(pipeline::SampleProcessor& processor, const Params& params, const uint8_t* data,
                size_t size) {
  const auto side = static_cast<size_t>(params.transform.size);
  Outcome o;
  o.pixels.resize(side * side * 3);  // exactly what process() may write: ASan sees any overrun
  pipeline::StageTimes times;
  try {
    processor.process(data, size, params.seed, params.epoch, params.index, o.pixels.data(), times);
    const int denom = processor.last_scale_denom();
    FUZZ_CHECK(denom == 1 || denom == 2 || denom == 4 || denom == 8);
  } catch (const Error& e) {
    o.error = e.code();
    o.pixels.clear();
  }
  return o;
}

void full_decode(const Params& params, const uint8_t* data, size_t size) {
  decode::ImageDecoder decoder(params.decode);
  try {
    const decode::ImageInfo info = decoder.open(data, size);
    FUZZ_CHECK(info.width > 0 && info.height > 0);
    FUZZ_CHECK(int64_t{info.width} * info.height <= kMaxPixels);
    const bool starts = decoder.starts();
    const decode::DecodedRegion& r = decoder.decode_full();
    FUZZ_CHECK(starts);
    FUZZ_CHECK(r.width == info.width && r.height == info.height);
    FUZZ_CHECK(r.origin_x == 0 && r.origin_y == 0 && r.scale_denom == 1);
    FUZZ_CHECK(r.stride >= ptrdiff_t{r.width} * 3);
    for (int y = 0; y < r.height; ++y)
      fuzz::touch(r.pixels + y * r.stride, static_cast<size_t>(r.width) * 3);
  } catch (const Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kParamBytes) return 0;
  const Params params = read_params(data);
  data += kParamBytes;
  size -= kParamBytes;

  pipeline::SampleProcessor processor(params.transform, params.decode);
  const Outcome first = process(processor, params, data, size);
  const Outcome again = process(processor, params, data, size);
  FUZZ_CHECK(first.error == again.error);
  FUZZ_CHECK(first.pixels == again.pixels);
  fuzz::touch(first.pixels.data(), first.pixels.size());

  if (params.full_decode) full_decode(params, data, size);
  return 0;
}
