// Image classification, ImageLoader's job: one square image (RandomResizedCrop + flip, or
// Resize + CenterCrop) and a label per sample. TransformOptions describe it; classification_fields
// turns them into the loader's fields; SampleProcessor renders one image that way (tools, tests,
// fuzzing).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "stoker/decode/image_decoder.h"
#include "stoker/fields/field.h"
#include "stoker/fields/image_renderer.h"
#include "stoker/transform/crop.h"
#include "stoker/transform/resize.h"

namespace stoker::pipeline {

struct TransformOptions {
  int size = 224;       // output is size x size
  bool train = true;    // RandomResizedCrop + flip; otherwise Resize + CenterCrop
  int resize_size = 0;  // eval: shorter side before the crop; 0 means round(size * 256 / 224)
  double flip_probability = 0.5;
  transform::RandomResizedCropOptions crop;
  bool allow_dct_scaling = true;  // off: always decode at full size (for comparisons)

  int effective_resize_size() const;
};

struct StageTimes {
  int64_t read_ns = 0, decode_ns = 0, transform_ns = 0;
  std::array<int64_t, 4> scales{};  // images decoded at 1/1, 1/2, 1/4, 1/8 (FieldTimes::scales)
};

// "image" (Image of jpg, jpeg, png or webp) and "label" (Label of cls, -1 where absent).
std::vector<fields::FieldSpec> classification_fields(const TransformOptions& transform,
                                                     const decode::DecodeOptions& decode);

class SampleProcessor {
 public:
  SampleProcessor(TransformOptions transform, decode::DecodeOptions decode);

  // Writes size*size*3 bytes (RGB, rows of size*3 bytes) to `out`. The crop and flip are drawn
  // from KeyedRandom(seed, epoch, sample_index). Adds the decode and transform time to `times`.
  // Throws Error.
  void process(const uint8_t* data, size_t size, uint64_t seed, int64_t epoch, int64_t sample_index,
               uint8_t* out, StageTimes& times);

  // The DCT scale chosen for the last sample (1, 2, 4 or 8), for tests and stats.
  int last_scale_denom() const { return last_scale_denom_; }

 private:
  TransformOptions transform_;
  fields::GeometryOptions geometry_;
  fields::ImageRenderer renderer_;
  int last_scale_denom_ = 1;
};

// The largest of 1, 2, 4, 8 (up to max_denom) at which `box` still has at least `out` pixels on
// each side: decoding smaller would throw information away before the antialiasing filter.
inline int choose_scale_denom(const transform::Box& box, int out, int max_denom) {
  return fields::choose_scale_denom(box, out, out, max_denom);
}

}  // namespace stoker::pipeline
