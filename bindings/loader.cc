// The loader: batches cross into torch as DLPack tensors that own a lease on their batch slot, so
// the slot is reused only after torch frees the tensor. Waiting for a batch releases the GIL.
#include "stoker/pipeline/loader.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.h"

namespace nb = nanobind;

namespace stoker::bindings {

namespace {

using pipeline::Batch;
using pipeline::BatchSlot;
using pipeline::Loader;
using pipeline::LoaderOptions;

nb::capsule lease(const std::shared_ptr<BatchSlot>& slot) {
  auto* owner = new std::shared_ptr<BatchSlot>(slot);
  return nb::capsule(owner,
                     [](void* p) noexcept { delete static_cast<std::shared_ptr<BatchSlot>*>(p); });
}

// Waits in slices so that Ctrl-C reaches Python while a batch is being made.
nb::object next_batch(Loader& loader) {
  Batch batch;
  while (true) {
    pipeline::NextStatus status;
    {
      nb::gil_scoped_release release;
      status = loader.next(batch, 100);
    }
    if (status == pipeline::NextStatus::kEnd) return nb::none();
    if (status == pipeline::NextStatus::kBatch) break;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
  const size_t b = static_cast<size_t>(batch.size);
  const size_t side = static_cast<size_t>(loader.options().transform.size);
  using Images = nb::ndarray<nb::pytorch, uint8_t, nb::ndim<4>, nb::c_contig>;
  using Vector = nb::ndarray<nb::pytorch, int64_t, nb::ndim<1>, nb::c_contig>;
  Images images(batch.images(), {b, side, side, 3}, lease(batch.slot));
  Vector labels(batch.labels(), {b}, lease(batch.slot));
  Vector indices(batch.indices(), {b}, lease(batch.slot));
  return nb::make_tuple(images, labels, indices, reinterpret_cast<uintptr_t>(batch.images()),
                        batch.batch_number);
}

nb::dict skipped_dict(const pipeline::SkippedSample& k) {
  nb::dict d;
  d["index"] = k.index;
  d["shard"] = k.shard;
  d["key"] = k.key;
  d["code"] = static_cast<int>(k.code);
  d["reason"] = k.reason;
  return d;
}

}  // namespace

void register_loader(nb::module_& m) {
  nb::class_<Loader>(m, "Loader")
      .def(
          "__init__",
          [](Loader* self, std::shared_ptr<const format::Dataset> dataset, int64_t batch_size,
             int size, bool train, bool shuffle, uint64_t seed, bool drop_last, int threads,
             int prefetch, int rank, int world_size, bool skip_errors, int64_t max_errors,
             double max_error_fraction, int resize_size, bool verify_crc, int64_t max_pixels,
             int max_scans, int64_t max_decode_memory, bool fast_upsampling, bool exact_progressive,
             bool dct_scaling, double scale_min, double scale_max, double ratio_min,
             double ratio_max, double flip_probability, bool keep_slots, bool autotune,
             int64_t read_latency_us) {
            LoaderOptions o;
            o.batch_size = batch_size;
            o.transform.size = size;
            o.transform.train = train;
            o.transform.resize_size = resize_size;
            o.transform.flip_probability = flip_probability;
            o.transform.allow_dct_scaling = dct_scaling;
            o.transform.crop = {scale_min, scale_max, ratio_min, ratio_max, 10};
            o.decode.max_pixels = max_pixels;
            o.decode.max_scans = max_scans;
            o.decode.max_decode_memory = max_decode_memory;
            o.decode.fast_upsampling = fast_upsampling;
            o.decode.progressive_shortcut = !exact_progressive;
            o.shuffle = shuffle;
            o.seed = seed;
            o.drop_last = drop_last;
            o.threads = threads;
            o.prefetch = prefetch;
            o.rank = rank;
            o.world_size = world_size;
            o.on_error = skip_errors ? pipeline::ErrorPolicy::kSkip : pipeline::ErrorPolicy::kRaise;
            o.max_errors = max_errors;
            o.max_error_fraction = max_error_fraction;
            o.verify_crc = verify_crc;
            o.keep_slots = keep_slots;
            o.autotune = autotune;
            o.read_latency_us = read_latency_us;
            nb::gil_scoped_release release;
            new (self) Loader(std::move(dataset), o);
          },
          nb::arg("dataset"), nb::arg("batch_size"), nb::arg("size"), nb::arg("train"),
          nb::arg("shuffle"), nb::arg("seed"), nb::arg("drop_last"), nb::arg("threads"),
          nb::arg("prefetch"), nb::arg("rank"), nb::arg("world_size"), nb::arg("skip_errors"),
          nb::arg("max_errors"), nb::arg("max_error_fraction"), nb::arg("resize_size"),
          nb::arg("verify_crc"), nb::arg("max_pixels"), nb::arg("max_scans"),
          nb::arg("max_decode_memory"), nb::arg("fast_upsampling"), nb::arg("exact_progressive"),
          nb::arg("dct_scaling"), nb::arg("scale_min"), nb::arg("scale_max"), nb::arg("ratio_min"),
          nb::arg("ratio_max"), nb::arg("flip_probability"), nb::arg("keep_slots") = false,
          nb::arg("autotune") = false, nb::arg("read_latency_us") = 0)
      .def_prop_ro("num_batches", &Loader::num_batches)
      .def_prop_ro("samples_per_rank", &Loader::samples_per_rank)
      .def_prop_ro("threads", &Loader::threads)
      .def_prop_ro("max_threads", &Loader::max_threads)
      .def_prop_ro("slot_bytes", &Loader::slot_bytes)
      .def_prop_ro("slots_allocated", &Loader::slots_allocated)
      .def("set_epoch", &Loader::set_epoch, nb::call_guard<nb::gil_scoped_release>())
      .def("state",
           [](const Loader& l) {
             const pipeline::LoaderState s = l.state();
             return nb::make_tuple(s.epoch, s.batches_done);
           })
      .def(
          "load_state",
          [](Loader& l, int64_t epoch, int64_t batches_done) {
            l.load_state({epoch, batches_done});
          },
          nb::call_guard<nb::gil_scoped_release>())
      .def("begin", &Loader::begin, nb::call_guard<nb::gil_scoped_release>())
      .def("next", &next_batch,
           "(images NHWC uint8, labels, indices, slot address, batch number), or None at the end")
      .def("close", &Loader::close, nb::call_guard<nb::gil_scoped_release>())
      .def("stats",
           [](const Loader& l) {
             const pipeline::LoaderStats s = l.stats();
             nb::dict out;
             out["samples"] = s.samples;
             out["batches"] = s.batches;
             out["skipped"] = s.skipped;
             out["pass_skipped"] = s.pass_skipped;
             nb::dict seconds;
             seconds["read"] = s.read_s;
             seconds["decode"] = s.decode_s;
             seconds["transform"] = s.transform_s;
             seconds["collate"] = s.collate_s;
             seconds["wait"] = s.wait_s;
             out["threads"] = s.threads;
             out["prefetch"] = s.prefetch;
             out["seconds"] = seconds;
             nb::list skipped;
             for (const auto& k : s.skipped_samples) skipped.append(skipped_dict(k));
             out["skipped_samples"] = skipped;
             return out;
           })
      .def("tuning",
           [](const Loader& l) {
             nb::list out;
             for (const pipeline::TuneStep& t : l.tuning()) {
               nb::dict d;
               d["at"] = t.at_seconds;
               d["threads"] = t.during.threads;
               d["prefetch"] = t.during.prefetch;
               d["samples_per_second"] = t.samples_per_second;
               d["wait_fraction"] = t.wait_fraction;
               d["busy_fraction"] = t.busy_fraction;
               d["next_threads"] = t.next.threads;
               d["next_prefetch"] = t.next.prefetch;
               out.append(d);
             }
             return out;
           })
      .def("skipped_since", [](const Loader& l, size_t first) {
        nb::list out;
        for (const auto& k : l.skipped_since(first)) out.append(skipped_dict(k));
        return out;
      });
}

}  // namespace stoker::bindings
