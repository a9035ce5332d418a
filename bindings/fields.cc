// The option structs of the engine, bound as classes: each option is declared once, in its C++
// struct (fields/field.h, decode/image_decoder.h, pipeline/loader.h), and here only named. The
// Python layer (stoker.fields, stoker.loader) builds them by attribute.
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string_view>

#include "bindings.h"
#include "stoker/core/error.h"
#include "stoker/fields/field.h"
#include "stoker/pipeline/loader.h"

namespace nb = nanobind;

namespace stoker::bindings {

void register_fields(nb::module_& m) {
  using namespace fields;
  nb::enum_<DType>(m, "DType")
      .value("bool", DType::kBool)
      .value("uint8", DType::kUInt8)
      .value("int8", DType::kInt8)
      .value("uint16", DType::kUInt16)
      .value("int16", DType::kInt16)
      .value("uint32", DType::kUInt32)
      .value("int32", DType::kInt32)
      .value("uint64", DType::kUInt64)
      .value("int64", DType::kInt64)
      .value("float16", DType::kFloat16)
      .value("float32", DType::kFloat32)
      .value("float64", DType::kFloat64);
  nb::enum_<GeometryKind>(m, "GeometryKind")
      .value("random_resized_crop", GeometryKind::kRandomResizedCrop)
      .value("resize_center_crop", GeometryKind::kResizeCenterCrop)
      .value("resize", GeometryKind::kResize)
      .value("letterbox", GeometryKind::kLetterbox)
      .value("random_crop", GeometryKind::kRandomCrop)
      .value("cover_crop", GeometryKind::kCoverCrop);
  nb::enum_<FieldKind>(m, "FieldKind")
      .value("image", FieldKind::kImage)
      .value("mask", FieldKind::kMask)
      .value("boxes", FieldKind::kBoxes)
      .value("label", FieldKind::kLabel)
      .value("array", FieldKind::kArray)
      .value("bytes", FieldKind::kBytes)
      .value("tokens", FieldKind::kTokens)
      .value("video", FieldKind::kVideo)
      .value("audio", FieldKind::kAudio);
  nb::enum_<MediaStart>(m, "MediaStart")
      .value("random", MediaStart::kRandom)
      .value("center", MediaStart::kCenter)
      .value("start", MediaStart::kStart);
  nb::enum_<ShortClip>(m, "ShortClip")
      .value("loop", ShortClip::kLoop)
      .value("pad", ShortClip::kPad)
      .value("skip", ShortClip::kSkip);
  nb::enum_<BoxFormat>(m, "BoxFormat")
      .value("xyxy", BoxFormat::kXYXY)
      .value("xywh", BoxFormat::kXYWH)
      .value("cxcywh", BoxFormat::kCXCYWH);
  nb::enum_<pipeline::MissingPolicy>(m, "MissingPolicy")
      .value("error", pipeline::MissingPolicy::kError)
      .value("skip", pipeline::MissingPolicy::kSkip);
  nb::enum_<pipeline::ErrorPolicy>(m, "ErrorPolicy")
      .value("raise_", pipeline::ErrorPolicy::kRaise)
      .value("skip", pipeline::ErrorPolicy::kSkip)
      .value("replace", pipeline::ErrorPolicy::kReplace);
  nb::enum_<pipeline::ShuffleMode>(m, "ShuffleMode")  // pipeline/sampler.h
      .value("none", pipeline::ShuffleMode::kNone)
      .value("global_", pipeline::ShuffleMode::kGlobal)
      .value("block", pipeline::ShuffleMode::kBlock);
  nb::enum_<pipeline::Leftovers>(m, "Leftovers")  // pipeline/batch_plan.h
      .value("carry", pipeline::Leftovers::kCarry)
      .value("drop", pipeline::Leftovers::kDrop)
      .value("partial", pipeline::Leftovers::kPartial);

  nb::class_<decode::DecodeOptions>(m, "DecodeOptions")
      .def(nb::init<>())
      .def_rw("max_pixels", &decode::DecodeOptions::max_pixels)
      .def_rw("max_scans", &decode::DecodeOptions::max_scans)
      .def_rw("max_decode_memory", &decode::DecodeOptions::max_decode_memory)
      .def_rw("fast_upsampling", &decode::DecodeOptions::fast_upsampling)
      .def_rw("fast_idct", &decode::DecodeOptions::fast_idct)
      .def_rw("progressive_shortcut", &decode::DecodeOptions::progressive_shortcut)
      .def_rw("restart_roi", &decode::DecodeOptions::restart_roi)
      .def_rw("restart_huffman", &decode::DecodeOptions::restart_huffman)
      .def_rw("scan_index", &decode::DecodeOptions::scan_index)
      .def_rw("max_scan_index_memory", &decode::DecodeOptions::max_scan_index_memory)
      .def_rw("read_to_end", &decode::DecodeOptions::read_to_end);
  nb::class_<transform::RandomResizedCropOptions>(m, "RandomResizedCropOptions")
      .def(nb::init<>())
      .def_rw("scale_min", &transform::RandomResizedCropOptions::scale_min)
      .def_rw("scale_max", &transform::RandomResizedCropOptions::scale_max)
      .def_rw("ratio_min", &transform::RandomResizedCropOptions::ratio_min)
      .def_rw("ratio_max", &transform::RandomResizedCropOptions::ratio_max)
      .def_rw("tries", &transform::RandomResizedCropOptions::tries);
  nb::class_<GeometryOptions>(m, "GeometryOptions")
      .def(nb::init<>())
      .def_rw("kind", &GeometryOptions::kind)
      .def_rw("crop", &GeometryOptions::crop)
      .def_rw("resize_size", &GeometryOptions::resize_size)
      .def_rw("random_position", &GeometryOptions::random_position)
      .def_rw("padding", &GeometryOptions::padding)
      .def_rw("hflip", &GeometryOptions::hflip)
      .def_rw("vflip", &GeometryOptions::vflip);
  nb::class_<ImageOptions>(m, "ImageOptions")
      .def(nb::init<>())
      .def_rw("height", &ImageOptions::height)
      .def_rw("width", &ImageOptions::width)
      .def_rw("channels", &ImageOptions::channels)
      .def_rw("geometry", &ImageOptions::geometry)
      .def_rw("fill", &ImageOptions::fill)
      .def_rw("allow_dct_scaling", &ImageOptions::allow_dct_scaling)
      .def_rw("decode", &ImageOptions::decode)
      .def_rw("return_params", &ImageOptions::return_params)
      .def_rw("augment", &ImageOptions::augment)
      .def_rw("device_decode", &ImageOptions::device_decode)
      .def_rw("device_max_scale_denom", &ImageOptions::device_max_scale_denom);
  nb::class_<MaskOptions>(m, "MaskOptions")
      .def(nb::init<>())
      .def_rw("fill", &MaskOptions::fill)
      .def_rw("decode", &MaskOptions::decode);
  nb::class_<BoxesOptions>(m, "BoxesOptions")
      .def(nb::init<>())
      .def_rw("source_format", &BoxesOptions::source_format)
      .def_rw("source_normalized", &BoxesOptions::source_normalized)
      .def_rw("format", &BoxesOptions::format)
      .def_rw("normalized", &BoxesOptions::normalized)
      .def_rw("max_boxes", &BoxesOptions::max_boxes)
      .def_rw("min_visible", &BoxesOptions::min_visible)
      .def_rw("max_stored_boxes", &BoxesOptions::max_stored_boxes);
  nb::class_<ArrayOptions>(m, "ArrayOptions")
      .def(nb::init<>())
      .def_rw("dtype", &ArrayOptions::dtype)
      .def_rw("shape", &ArrayOptions::shape)
      .def_rw("max_length", &ArrayOptions::max_length)
      .def_rw("max_elements", &ArrayOptions::max_elements);
  nb::class_<fields::TokensOptions>(m, "TokensOptions")
      .def(nb::init<>())
      .def_rw("seq_len", &fields::TokensOptions::seq_len)
      .def_rw("eos_id", &fields::TokensOptions::eos_id)
      .def_rw("positions", &fields::TokensOptions::positions);
  nb::class_<MediaLimitOptions>(m, "MediaLimitOptions")
      .def(nb::init<>())
      .def_rw("max_pixels", &MediaLimitOptions::max_pixels)
      .def_rw("max_frames", &MediaLimitOptions::max_frames)
      .def_rw("max_seconds", &MediaLimitOptions::max_seconds)
      .def_rw("max_decoded_frames", &MediaLimitOptions::max_decoded_frames)
      .def_rw("max_sample_rate", &MediaLimitOptions::max_sample_rate)
      .def_rw("max_channels", &MediaLimitOptions::max_channels);
  nb::class_<VideoOptions>(m, "VideoOptions")
      .def(nb::init<>())
      .def_rw("frames", &VideoOptions::frames)
      .def_rw("stride", &VideoOptions::stride)
      .def_rw("fps", &VideoOptions::fps)
      .def_rw("height", &VideoOptions::height)
      .def_rw("width", &VideoOptions::width)
      .def_rw("geometry", &VideoOptions::geometry)
      .def_rw("fill", &VideoOptions::fill)
      .def_rw("start", &VideoOptions::start)
      .def_rw("short_clip", &VideoOptions::short_clip)
      .def_rw("decoder_threads", &VideoOptions::decoder_threads)
      .def_rw("limits", &VideoOptions::limits);
  nb::class_<AudioOptions>(m, "AudioOptions")
      .def(nb::init<>())
      .def_rw("seconds", &AudioOptions::seconds)
      .def_rw("sample_rate", &AudioOptions::sample_rate)
      .def_rw("channels", &AudioOptions::channels)
      .def_rw("start", &AudioOptions::start)
      .def_rw("limits", &AudioOptions::limits)
      .def("samples", &AudioOptions::samples);
  m.def(
      "install_media_plugin",
      [](nb::capsule plugin) {
        STOKER_CHECK(std::string_view(plugin.name() ? plugin.name() : "") == "stoker.media_plugin",
                     ErrorCode::kInvalidArgument, "not stoker's media plugin");
        install_media_plugin(static_cast<const StokerMediaPlugin*>(plugin.data()));
      },
      nb::arg("plugin"),
      "Installs the media plugin (stoker._media.plugin()) the Video and Audio fields decode "
      "with.");
  m.def(
      "media_plugin_library",
      []() -> std::string {
        const StokerMediaPlugin* p = media_plugin();
        return p ? p->library : "";
      },
      "What the installed media plugin decodes with (\"\": none installed).");
  nb::class_<FieldSpec>(m, "FieldSpec")
      .def(nb::init<>())
      .def_rw("name", &FieldSpec::name)
      .def_rw("kind", &FieldSpec::kind)
      .def_rw("member", &FieldSpec::member)
      .def_rw("follow", &FieldSpec::follow)
      .def_rw("optional", &FieldSpec::optional)
      .def_rw("max_member_bytes", &FieldSpec::max_member_bytes)
      .def_rw("image", &FieldSpec::image)
      .def_rw("mask", &FieldSpec::mask)
      .def_rw("boxes", &FieldSpec::boxes)
      .def_rw("array", &FieldSpec::array)
      .def_rw("tokens", &FieldSpec::tokens)
      .def_rw("video", &FieldSpec::video)
      .def_rw("audio", &FieldSpec::audio);

  nb::class_<pipeline::LoaderOptions>(m, "LoaderOptions")
      .def(nb::init<>())
      .def_rw("batch_size", &pipeline::LoaderOptions::batch_size)
      .def_rw("fields", &pipeline::LoaderOptions::fields)
      .def_rw("missing", &pipeline::LoaderOptions::missing)
      .def_rw("shuffle", &pipeline::LoaderOptions::shuffle)
      .def_rw("shuffle_window", &pipeline::LoaderOptions::shuffle_window)
      .def_rw("seed", &pipeline::LoaderOptions::seed)
      .def_rw("drop_last", &pipeline::LoaderOptions::drop_last)
      .def_rw("threads", &pipeline::LoaderOptions::threads)
      .def_rw("prefetch", &pipeline::LoaderOptions::prefetch)
      .def_rw("autotune", &pipeline::LoaderOptions::autotune)
      .def_rw("read_latency_us", &pipeline::LoaderOptions::read_latency_us)
      .def_rw("rank", &pipeline::LoaderOptions::rank)
      .def_rw("world_size", &pipeline::LoaderOptions::world_size)
      .def_rw("on_error", &pipeline::LoaderOptions::on_error)
      .def_rw("max_errors", &pipeline::LoaderOptions::max_errors)
      .def_rw("max_error_fraction", &pipeline::LoaderOptions::max_error_fraction)
      .def_rw("verify_crc", &pipeline::LoaderOptions::verify_crc)
      .def_rw("keep_slots", &pipeline::LoaderOptions::keep_slots)
      .def_rw("load_samples", &pipeline::LoaderOptions::load_samples)
      .def_rw("grouping", &pipeline::LoaderOptions::grouping)
      .def_rw("group_image_sizes", &pipeline::LoaderOptions::group_image_sizes)
      .def_rw("group_frames", &pipeline::LoaderOptions::group_frames)
      .def_rw("sized_field", &pipeline::LoaderOptions::sized_field);

  // A group per sample is one int32 a sample: handed over as an array, held once (shared).
  nb::class_<pipeline::GroupingOptions>(m, "GroupingOptions")
      .def(
          "__init__",
          [](pipeline::GroupingOptions* self,
             nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> group_of,
             std::vector<int64_t> batch_sizes, bool same_shape_across_ranks,
             pipeline::Leftovers leftovers) {
            new (self) pipeline::GroupingOptions();
            self->group_of.assign(group_of.data(), group_of.data() + group_of.shape(0));
            self->batch_sizes = std::move(batch_sizes);
            self->same_shape_across_ranks = same_shape_across_ranks;
            self->leftovers = leftovers;
          },
          nb::arg("group_of"), nb::arg("batch_sizes"), nb::arg("same_shape_across_ranks"),
          nb::arg("leftovers"))
      .def_ro("batch_sizes", &pipeline::GroupingOptions::batch_sizes)
      .def_ro("same_shape_across_ranks", &pipeline::GroupingOptions::same_shape_across_ranks)
      .def_ro("leftovers", &pipeline::GroupingOptions::leftovers)
      .def_prop_ro("num_samples",
                   [](const pipeline::GroupingOptions& g) { return g.group_of.size(); });
}

}  // namespace stoker::bindings
