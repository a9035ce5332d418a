#include "stoker/pipeline/sample_processor.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "stoker/core/error.h"
#include "stoker/core/random.h"

namespace stoker::pipeline {

namespace {

// libjpeg's fancy upsampling treats a cropped region's border as an image border, so pixels within
// two of a crop edge may differ from a full decode; decoding this much extra keeps them unused.
constexpr int kCropMargin = 2;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int TransformOptions::effective_resize_size() const {
  return resize_size > 0 ? resize_size : static_cast<int>(std::lround(size * 256.0 / 224.0));
}

int choose_scale_denom(const transform::Box& box, int out, int max_denom) {
  int denom = 1;
  while (denom * 2 <= max_denom && box.width() / (denom * 2) >= out &&
         box.height() / (denom * 2) >= out)
    denom *= 2;
  return denom;
}

SampleProcessor::SampleProcessor(TransformOptions transform, decode::DecodeOptions decode)
    : transform_(transform), decoder_(decode) {
  STOKER_CHECK(transform.size > 0 && transform.size <= 8192, ErrorCode::kInvalidArgument,
               "size must be 1-8192");
}

void SampleProcessor::process(const uint8_t* data, size_t size, uint64_t seed, int64_t epoch,
                              int64_t sample_index, uint8_t* out, StageTimes& times) {
  const int64_t t0 = now_ns();
  const decode::ImageInfo& info = decoder_.open(data, size);
  const int out_size = transform_.size;
  KeyedRandom rng(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample_index));
  transform::Box box;
  bool flip = false;
  if (transform_.train) {
    box = transform::random_resized_crop(info.width, info.height, rng, transform_.crop);
    flip = rng.uniform() < transform_.flip_probability;
  } else {
    box = transform::resize_center_crop(info.width, info.height,
                                        transform_.effective_resize_size(), out_size);
  }
  const int denom = transform_.allow_dct_scaling
                        ? choose_scale_denom(box, out_size, decoder_.max_scale_denom())
                        : 1;
  last_scale_denom_ = denom;
  const transform::Box scaled{box.x0 / denom, box.y0 / denom, box.x1 / denom, box.y1 / denom};
  const int scaled_w = decode::scaled_size(info.width, denom);
  const int scaled_h = decode::scaled_size(info.height, denom);
  const transform::PixelRect need =
      transform::resample_support(scaled, out_size, out_size, scaled_w, scaled_h);
  const decode::DecodedRegion& region =
      decoder_.decode(denom, need.x0 - kCropMargin, need.y0 - kCropMargin,
                      need.x1 + kCropMargin, need.y1 + kCropMargin);
  const int64_t t1 = now_ns();
  transform::RegionView view;
  view.pixels = region.pixels;
  view.width = region.width;
  view.height = region.height;
  view.stride = region.stride;
  view.origin_x = region.origin_x;
  view.origin_y = region.origin_y;
  view.image_width = region.scaled_width;
  view.image_height = region.scaled_height;
  resampler_.resize(view, scaled, out, out_size, out_size, static_cast<ptrdiff_t>(out_size) * 3,
                    flip);
  const int64_t t2 = now_ns();
  times.decode_ns += t1 - t0;
  times.transform_ns += t2 - t1;
}

}  // namespace stoker::pipeline
