// The field kinds' decoders, made by FieldSet::make_decoder.
#pragma once

#include <memory>

#include "stoker/fields/field.h"

namespace stoker::fields::detail {

// `stream`: which random stream an Image drawing its own geometry uses (0 for the first field,
// so that a one-image loader draws what ImageLoader always drew).
std::unique_ptr<FieldDecoder> make_image_decoder(
    const FieldSpec& spec, bool follows, int stream,
    std::shared_ptr<decode::ScanIndexCache> scan_indexes);
std::unique_ptr<FieldDecoder> make_mask_decoder(const FieldSpec& spec);
std::unique_ptr<FieldDecoder> make_boxes_decoder(const FieldSpec& spec, bool follows);
std::unique_ptr<FieldDecoder> make_label_decoder();
std::unique_ptr<FieldDecoder> make_array_decoder(const FieldSpec& spec);
std::unique_ptr<FieldDecoder> make_bytes_decoder();
std::unique_ptr<FieldDecoder> make_tokens_decoder(const FieldSpec& spec);
// `field`: the field's index, which keys its random stream. Both throw Error(kUnsupported) when
// no media plugin is installed (media_plugin.h).
std::unique_ptr<FieldDecoder> make_video_decoder(const FieldSpec& spec, int field);
std::unique_ptr<FieldDecoder> make_audio_decoder(const FieldSpec& spec, int field);

// The geometry `g` (drawn for an image of g.source_width x g.source_height) for an image of
// width x height covering the same scene: its box scaled by the ratio of the sizes.
Geometry rescale_geometry(const Geometry& g, int width, int height);

}  // namespace stoker::fields::detail
