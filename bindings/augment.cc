// stoker.augment's worker form (augment/augment.h): the steps an Image field runs on each image
// (ImageOptions.augment), and the same ops and MixUp/CutMix's blend on a batch in hand.
#include "stoker/augment/augment.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <thread>

#include "bindings.h"
#include "stoker/core/error.h"

namespace nb = nanobind;

namespace stoker::bindings {

void register_augment(nb::module_& m) {
  nb::enum_<augment::StepKind>(m, "AugmentStepKind")
      .value("timm_rand_augment", augment::StepKind::kTimmRandAugment)
      .value("random_erasing", augment::StepKind::kRandomErasing)
      .value("color_jitter", augment::StepKind::kColorJitter)
      .value("random_grayscale", augment::StepKind::kRandomGrayscale)
      .value("gaussian_blur", augment::StepKind::kGaussianBlur)
      .value("torchvision_augment", augment::StepKind::kTorchvisionAugment);
  nb::class_<augment::ColorJitterOptions>(m, "ColorJitterOptions")
      .def(nb::init<>())
      .def_rw("brightness", &augment::ColorJitterOptions::brightness)
      .def_rw("contrast", &augment::ColorJitterOptions::contrast)
      .def_rw("saturation", &augment::ColorJitterOptions::saturation)
      .def_rw("hue", &augment::ColorJitterOptions::hue)
      .def_rw("streams", &augment::ColorJitterOptions::streams);
  nb::class_<augment::RandomGrayscaleOptions>(m, "RandomGrayscaleOptions")
      .def(nb::init<>())
      .def_rw("p", &augment::RandomGrayscaleOptions::p)
      .def_rw("stream", &augment::RandomGrayscaleOptions::stream);
  nb::class_<augment::GaussianBlurOptions>(m, "GaussianBlurOptions")
      .def(nb::init<>())
      .def_rw("kernel_width", &augment::GaussianBlurOptions::kernel_width)
      .def_rw("kernel_height", &augment::GaussianBlurOptions::kernel_height)
      .def_rw("sigma_min", &augment::GaussianBlurOptions::sigma_min)
      .def_rw("sigma_max", &augment::GaussianBlurOptions::sigma_max)
      .def_rw("stream", &augment::GaussianBlurOptions::stream);
  nb::class_<augment::TorchvisionAugmentOptions>(m, "TorchvisionAugmentOptions")
      .def(nb::init<>())
      .def_rw("bins", &augment::TorchvisionAugmentOptions::bins)
      .def_rw("magnitudes", &augment::TorchvisionAugmentOptions::magnitudes)
      .def_rw("fill_outside", &augment::TorchvisionAugmentOptions::fill_outside)
      .def_rw("fill", &augment::TorchvisionAugmentOptions::fill)
      .def_rw("streams", &augment::TorchvisionAugmentOptions::streams);
  nb::enum_<augment::Resample>(m, "Resample")
      .value("nearest", augment::Resample::kNearest)
      .value("bilinear", augment::Resample::kBilinear)
      .value("bicubic", augment::Resample::kBicubic);
  nb::class_<augment::TimmRandAugmentOptions>(m, "TimmRandAugmentOptions")
      .def(nb::init<>())
      .def_rw("magnitude", &augment::TimmRandAugmentOptions::magnitude)
      .def_rw("magnitude_std", &augment::TimmRandAugmentOptions::magnitude_std)
      .def_rw("prob", &augment::TimmRandAugmentOptions::prob)
      .def_rw("magnitude_max", &augment::TimmRandAugmentOptions::magnitude_max)
      .def_rw("fill", &augment::TimmRandAugmentOptions::fill)
      .def_rw("interpolation", &augment::TimmRandAugmentOptions::interpolation)
      .def_rw("streams", &augment::TimmRandAugmentOptions::streams);
  nb::class_<augment::RandomErasingOptions>(m, "RandomErasingOptions")
      .def(nb::init<>())
      .def_rw("p", &augment::RandomErasingOptions::p)
      .def_rw("scale", &augment::RandomErasingOptions::scale)
      .def_rw("ratio", &augment::RandomErasingOptions::ratio)
      .def_rw("value", &augment::RandomErasingOptions::value)
      .def_rw("streams", &augment::RandomErasingOptions::streams);
  nb::class_<augment::Step>(m, "AugmentStep")
      .def(nb::init<>())
      .def_rw("kind", &augment::Step::kind)
      .def_rw("timm_rand_augment", &augment::Step::timm_rand_augment)
      .def_rw("random_erasing", &augment::Step::random_erasing)
      .def_rw("color_jitter", &augment::Step::color_jitter)
      .def_rw("random_grayscale", &augment::Step::random_grayscale)
      .def_rw("gaussian_blur", &augment::Step::gaussian_blur)
      .def_rw("torchvision_augment", &augment::Step::torchvision_augment);
  // The workers' host augmentation on a batch of uint8 NHWC images in place (tests compare it
  // with stoker.augment's torch ops; samples[i] is image i's index, its draws' key).
  m.def(
      "augment_images",
      [](const std::vector<augment::Step>& steps,
         nb::ndarray<uint8_t, nb::ndim<4>, nb::c_contig, nb::device::cpu> images,
         nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> samples,
         uint64_t seed, int64_t epoch, int threads) {
        for (const auto& step : steps) augment::check(step);
        if (images.shape(3) != 3 || samples.shape(0) != images.shape(0))
          throw Error(ErrorCode::kInvalidArgument,
                      "augment_images takes uint8 [N, H, W, 3] and N sample indices");
        const auto height = static_cast<int>(images.shape(1)),
                   width = static_cast<int>(images.shape(2));
        const size_t image_bytes = static_cast<size_t>(height) * width * 3;
        const auto n = static_cast<int64_t>(images.shape(0));
        uint8_t* data = images.data();
        const int64_t* index = samples.data();
        nb::gil_scoped_release release;
        // Samples split between `threads` threads, each image on one: the same bytes whatever
        // the split (every draw is keyed by the sample).
        auto run = [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i)
            augment::apply(steps, {data + static_cast<size_t>(i) * image_bytes, width, height},
                           seed, epoch, index[i]);
        };
        const int64_t parts = std::clamp<int64_t>(threads, 1, std::max<int64_t>(n, 1));
        std::vector<std::exception_ptr> failed(static_cast<size_t>(parts));
        auto part = [&](int64_t t) {
          try {
            run(n * t / parts, n * (t + 1) / parts);
          } catch (...) {
            failed[static_cast<size_t>(t)] = std::current_exception();
          }
        };
        std::vector<std::thread> pool;
        try {
          for (int64_t t = 1; t < parts; ++t) pool.emplace_back(part, t);
        } catch (...) {  // no thread to be had: the rest on this one
          for (int64_t t = static_cast<int64_t>(pool.size()) + 1; t < parts; ++t) part(t);
        }
        part(0);
        for (auto& thread : pool) thread.join();
        for (const auto& e : failed)
          if (e) std::rethrow_exception(e);
      },
      nb::arg("steps"), nb::arg("images").noconvert(), nb::arg("samples"), nb::arg("seed"),
      nb::arg("epoch"), nb::arg("threads") = 1);
  using Images = nb::ndarray<const uint8_t, nb::ndim<4>, nb::c_contig, nb::device::cpu>;
  using Out = nb::ndarray<uint8_t, nb::ndim<4>, nb::c_contig, nb::device::cpu>;
  // One op at one magnitude over each image of a uint8 NHWC batch in place, on this thread
  // (benchmarks/augment.py's per-op table; tests of each op against torch and PIL).
  m.def(
      "augment_op",
      [](nb::ndarray<uint8_t, nb::ndim<4>, nb::c_contig, nb::device::cpu> images,
         const std::string& op, double magnitude, std::array<uint8_t, 3> fill) {
        if (images.shape(3) != 3)
          throw Error(ErrorCode::kInvalidArgument, "augment_op takes uint8 [N, H, W, 3]");
        const auto height = static_cast<int>(images.shape(1)),
                   width = static_cast<int>(images.shape(2));
        const size_t image_bytes = static_cast<size_t>(height) * width * 3;
        uint8_t* data = images.data();
        const size_t n = images.shape(0);
        nb::gil_scoped_release release;
        for (size_t i = 0; i < n; ++i)
          augment::apply_op({data + i * image_bytes, width, height}, op, magnitude, fill);
      },
      nb::arg("images").noconvert(), nb::arg("op"), nb::arg("magnitude") = 0.0,
      nb::arg("fill") = std::array<uint8_t, 3>{0, 0, 0});
  m.def("check_augment_step", &augment::check, nb::arg("step"),
        "Raises InvalidArgumentError where the workers would refuse this step's options.");
  // MixUp/CutMix's blend of a uint8 NHWC batch with its flipped self, into `out`.
  m.def(
      "blend_pairs",
      [](Images images, Out out,
         std::optional<nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>> lam,
         std::optional<nb::ndarray<const bool, nb::ndim<3>, nb::c_contig, nb::device::cpu>> paste) {
        const size_t n = images.shape(0), h = images.shape(1), w = images.shape(2);
        bool ok = out.shape(0) == n && out.shape(1) == h && out.shape(2) == w &&
                  out.shape(3) == images.shape(3);
        if (lam) ok = ok && lam->shape(0) == n;
        if (paste) ok = ok && paste->shape(0) == n && paste->shape(1) == h && paste->shape(2) == w;
        if (!ok)
          throw Error(
              ErrorCode::kInvalidArgument,
              "blend_pairs takes images and out uint8 [N, H, W, C], lam [N], paste [N, H, W]");
        const uint8_t* in = images.data();
        uint8_t* dst = out.data();
        if (dst < in + images.size() && in < dst + out.size())
          throw Error(ErrorCode::kInvalidArgument, "blend_pairs: out overlaps images");
        const float* l = lam ? lam->data() : nullptr;
        const bool* p = paste ? paste->data() : nullptr;
        nb::gil_scoped_release release;
        augment::blend_pairs(in, dst, static_cast<int64_t>(n), static_cast<int64_t>(h * w),
                             static_cast<int>(images.shape(3)), l, p);
      },
      nb::arg("images"), nb::arg("out").noconvert(), nb::arg("lam").none(),
      nb::arg("paste").none());
}

}  // namespace stoker::bindings
