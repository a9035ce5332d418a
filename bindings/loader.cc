// The loader: batches cross into torch as DLPack tensors that own a lease on their batch slot, so
// the slot is reused only after torch frees the tensor. Waiting for a batch releases the GIL.
#include "stoker/pipeline/loader.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

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

nb::dlpack::dtype to_dlpack(DType t) {
  switch (t) {
    case DType::kBool: return nb::dtype<bool>();
    case DType::kUInt8: return nb::dtype<uint8_t>();
    case DType::kInt8: return nb::dtype<int8_t>();
    case DType::kUInt16: return nb::dtype<uint16_t>();
    case DType::kInt16: return nb::dtype<int16_t>();
    case DType::kUInt32: return nb::dtype<uint32_t>();
    case DType::kInt32: return nb::dtype<int32_t>();
    case DType::kUInt64: return nb::dtype<uint64_t>();
    case DType::kInt64: return nb::dtype<int64_t>();
    case DType::kFloat16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kFloat32: return nb::dtype<float>();
    case DType::kFloat64: return nb::dtype<double>();
  }
  return nb::dtype<uint8_t>();
}

nb::object batch_tuple(const Loader& loader, const Batch& batch);

// Waits in slices so that Ctrl-C reaches Python while a batch is being made. Returns
// ([one tensor per output], [one list of bytes per Bytes field], indices, slot address, batch
// number), or None at the end of the pass.
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
  return batch_tuple(loader, batch);
}

// A batch as next() returns it.
nb::object batch_tuple(const Loader& loader, const Batch& batch) {
  const auto b = static_cast<size_t>(batch.size);
  using Tensor = nb::ndarray<nb::pytorch, nb::c_contig>;
  nb::list outputs;
  std::vector<size_t> shape;
  const size_t num_outputs = loader.load_samples() ? loader.fields().outputs().size() : 0;
  for (size_t k = 0; k < num_outputs; ++k) {
    const fields::OutputSpec& o = loader.fields().outputs()[k];
    shape.assign(1, b);
    for (int64_t d : loader.output_shape(k, batch.group)) shape.push_back(static_cast<size_t>(d));
    outputs.append(Tensor(batch.output(k), shape.size(), shape.data(), lease(batch.slot), nullptr,
                          to_dlpack(o.dtype)));
  }
  nb::list blobs;
  for (const auto& field : batch.slot->blobs) {
    nb::list items;
    for (size_t i = 0; i < b; ++i) items.append(nb::bytes(field[i].data(), field[i].size()));
    blobs.append(items);
  }
  using Vector = nb::ndarray<nb::pytorch, int64_t, nb::ndim<1>, nb::c_contig>;
  Vector indices(batch.indices(), {b}, lease(batch.slot));
  return nb::make_tuple(outputs, blobs, indices, reinterpret_cast<uintptr_t>(batch.slot->block),
                        batch.batch_number);
}

nb::dict skipped_dict(const pipeline::SkippedSample& k) {
  nb::dict d;
  d["index"] = k.index;
  d["shard"] = k.shard;
  d["key"] = k.key;
  d["code"] = static_cast<int>(k.code);
  d["reason"] = k.reason;
  d["member"] = k.member;
  if (k.substitute >= 0) d["substitute"] = k.substitute;
  return d;
}

}  // namespace

void register_loader(nb::module_& m) {
  nb::class_<Loader>(m, "Loader")
      .def(
          "__init__",
          [](Loader* self, std::shared_ptr<const format::Dataset> dataset,
             const LoaderOptions& options) {
            // With the GIL held: the workers read the environment before this returns
            // (Loader::start_workers), and no Python code may change it meanwhile.
            new (self) Loader(std::move(dataset), options);
          },
          nb::arg("dataset"), nb::arg("options"))
      .def_prop_ro("options", &Loader::options)
      .def_prop_ro(
          "outputs",
          [](const Loader& l) {
            nb::list out;
            for (const fields::OutputSpec& o : l.fields().outputs())
              out.append(
                  nb::make_tuple(l.fields().specs()[static_cast<size_t>(o.field)].name, o.name));
            return out;
          },
          "(field name, output name) of each tensor next() returns")
      .def_prop_ro(
          "blob_fields",
          [](const Loader& l) {
            nb::list out;
            for (size_t f = 0; f < l.fields().specs().size(); ++f)
              if (l.fields().blob_index(static_cast<int>(f)) >= 0)
                out.append(l.fields().specs()[f].name);
            return out;
          },
          "names of the Bytes fields, in the order of next()'s lists")
      .def_prop_ro("num_batches", &Loader::num_batches)
      .def("batches_left", &Loader::batches_left,
           "Batches the pass in progress has yet to hand out (at most); 0 between passes")
      .def(
          "draw_geometry",
          [](const Loader& l, int field, int64_t epoch,
             nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> samples,
             int width, int height) {
            const size_t n = samples.shape(0);
            auto* params = new std::vector<double>(n * 14);
            {
              nb::gil_scoped_release release;
              const uint64_t seed = l.options().seed;
              for (size_t i = 0; i < n; ++i)
                fields::geometry_params(
                    l.fields().draw_geometry(field, seed, epoch, samples(i), width, height),
                    params->data() + i * 14);
            }
            nb::capsule owner(
                params, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
            return nb::ndarray<nb::numpy, double, nb::ndim<2>>(params->data(), {n, size_t{14}},
                                                               owner);
          },
          nb::arg("field"), nb::arg("epoch"), nb::arg("samples"), nb::arg("width"),
          nb::arg("height"),
          "The geometry params (as an Image's params output, [n, 14]) field `field` draws for "
          "each of `samples` of width x height pixels in `epoch`.")
      .def("step_samples", &Loader::step_samples, nb::arg("epoch"), nb::arg("step"),
           nb::arg("rank"), nb::arg("world_size"), nb::call_guard<nb::gil_scoped_release>())
      .def("upcoming_shards", &Loader::upcoming_shards, nb::arg("max"),
           nb::call_guard<nb::gil_scoped_release>(),
           "The distinct shards the pass reads next, soonest first: every shard of the batches in "
           "flight, then at most `max` more (a remote pack's fetch plan).")
      .def_prop_ro("samples_per_rank", &Loader::samples_per_rank)
      .def(
          "epoch_plan",
          [](const Loader& l, int64_t epoch, int world_size) -> nb::object {
            std::shared_ptr<const pipeline::EpochBatches> plan;
            {
              nb::gil_scoped_release release;
              plan = l.epoch_plan(epoch, world_size);
            }
            if (!plan) return nb::none();
            nb::dict out;
            out["steps"] = plan->steps();
            out["world_size"] = plan->world_size;
            out["groups"] = plan->groups;
            out["sizes"] = [&] {
              std::vector<int64_t> sizes;
              for (int64_t b = 0; b < plan->batches(); ++b) sizes.push_back(plan->batch_size(b));
              return sizes;
            }();
            out["carried_in"] = plan->carried_in;
            out["carried"] = plan->carried;
            out["dropped"] = plan->dropped;
            out["padded"] = plan->padded;
            return out;
          },
          nb::arg("epoch"), nb::arg("world_size"),
          "With grouping: epoch `epoch`'s plan at `world_size` ranks: its steps, every batch's "
          "group and size (batch s * world_size + r is rank r's step s), and its leftovers "
          "(carried_in, carried, dropped, padded); None without grouping.")
      .def_prop_ro("threads", &Loader::threads)
      .def_prop_ro("max_threads", &Loader::max_threads)
      .def_prop_ro("slot_bytes", &Loader::slot_bytes)
      .def_prop_ro("slots_allocated", &Loader::slots_allocated)
      .def("set_epoch", &Loader::set_epoch, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "set_ranks", &Loader::set_ranks, nb::arg("rank"), nb::arg("world_size"),
          nb::call_guard<nb::gil_scoped_release>(),
          "This process's share of the passes begun from now on; a pass in progress keeps its own.")
      .def(
          "state",
          [](const Loader& l) {
            const pipeline::LoaderState s = l.state();
            return nb::make_tuple(s.epoch, s.samples_consumed, s.batches_done);
          },
          "(epoch, samples_consumed by all ranks, batches_done by this rank)")
      .def(
          "load_state",
          [](Loader& l, int64_t epoch, int64_t samples_consumed, int64_t batches_done) {
            l.load_state({.epoch = epoch,
                          .samples_consumed = samples_consumed,
                          .batches_done = batches_done});
          },
          nb::arg("epoch"), nb::arg("samples_consumed"), nb::arg("batches_done") = 0,
          nb::call_guard<nb::gil_scoped_release>(),
          "Resume epoch `epoch` after samples_consumed positions (grouped: after batches_done "
          "steps)")
      .def("begin", &Loader::begin, nb::arg("max_batches") = -1,
           nb::call_guard<nb::gil_scoped_release>(),
           "Start a pass (from a loaded state if any); max_batches >= 0 ends it after that many")
      .def(
          "account_elsewhere",
          [](Loader& l, const nb::list& failures, int64_t missing) {
            std::vector<pipeline::SkippedSample> out;
            out.reserve(failures.size());
            for (nb::handle h : failures) {
              const nb::dict d = nb::cast<nb::dict>(h);
              pipeline::SkippedSample k;
              k.index = nb::cast<int64_t>(d["index"]);
              const int code = nb::cast<int>(d["code"]);
              k.code = code >= 0 && code <= static_cast<int>(ErrorCode::kErrorBudget)
                           ? static_cast<ErrorCode>(code)
                           : ErrorCode::kInternal;
              k.shard = nb::cast<std::string>(d["shard"]);
              k.key = nb::cast<std::string>(d["key"]);
              k.member = nb::cast<std::string>(d["member"]);
              k.reason = nb::cast<std::string>(d["reason"]);
              k.substitute = d.contains("substitute") ? nb::cast<int64_t>(d["substitute"]) : -1;
              out.push_back(std::move(k));
            }
            l.account_elsewhere(out, missing);
          },
          nb::arg("failures"), nb::arg("missing"),
          "load_samples=False: the last batch handed out was loaded elsewhere, where these "
          "failed (skipped_since's dicts, in batch order) and `missing` were left out: counted "
          "as this loader's own (stats, the skipped list, max_errors)")
      .def("next", &next_batch,
           "(images NHWC uint8, labels, indices, slot address, batch number), or None at the end")
      .def("close", &Loader::close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_rw("device_share", &Loader::device_share, &Loader::set_device_share,
                   "decode=\"gpu\"/\"auto\": the share of each batch begun from now on that "
                   "may go to the device decoder (its first positions)")
      .def(
          "decode_on_host",
          [](Loader& l, int64_t sample, int64_t epoch, int64_t position) -> nb::object {
            Batch batch;
            {
              nb::gil_scoped_release release;
              l.decode_on_host(sample, epoch, position, batch);
            }
            return batch.size == 0 ? nb::none() : batch_tuple(l, batch);
          },
          nb::arg("sample"), nb::arg("epoch"), nb::arg("position"),
          "A sample the device failed on, decoded here into a one-sample batch (next()'s "
          "tuple); the host's failure under on_error: raised, or None (skipped), or a "
          "substitute's batch (replace).")
      .def(
          "stats",
          [](const Loader& l, bool listed) {
            const pipeline::LoaderStats s = l.stats(listed);
            nb::dict out;
            out["samples"] = s.samples;
            out["batches"] = s.batches;
            out["skipped"] = s.skipped;
            out["replaced"] = s.replaced;
            out["missing"] = s.missing;
            out["pass_skipped"] = s.pass_skipped;
            nb::dict seconds;
            seconds["read"] = s.read_s;
            seconds["decode"] = s.decode_s;
            seconds["transform"] = s.transform_s;
            seconds["collate"] = s.collate_s;
            seconds["wait"] = s.wait_s;
            nb::dict scales;
            for (size_t k = 0; k < s.scales.size(); ++k) scales[nb::int_(1 << k)] = s.scales[k];
            out["dct_scales"] = scales;
            nb::dict scan_index;
            scan_index["images"] = s.scan_indexed;
            scan_index["bytes"] = s.scan_index_bytes;
            out["scan_index"] = scan_index;
            out["threads"] = s.threads;
            out["prefetch"] = s.prefetch;
            if (l.grouped()) {
              nb::dict leftovers;
              leftovers["carried"] = s.carried;
              leftovers["dropped"] = s.dropped;
              leftovers["padded"] = s.padded;
              out["leftovers"] = leftovers;
            }
            out["seconds"] = seconds;
            nb::list skipped;
            for (const auto& k : s.skipped_samples) skipped.append(skipped_dict(k));
            out["skipped_samples"] = skipped;
            return out;
          },
          nb::arg("listed") = true)
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
