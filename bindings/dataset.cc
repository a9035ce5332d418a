#include "stoker/format/dataset.h"

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "stoker/format/shard_writer.h"

namespace nb = nanobind;

namespace stoker::bindings {

void register_dataset(nb::module_& m) {
  using format::Dataset;
  nb::class_<Dataset>(m, "Dataset")
      .def_static("open", &Dataset::open, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
      .def_static("open_tars", &Dataset::open_tars, nb::arg("tar_paths"),
                  nb::call_guard<nb::gil_scoped_release>())
      .def("__len__", &Dataset::size)
      .def_prop_ro("classes", &Dataset::classes)
      .def_prop_ro("num_shards", &Dataset::num_shards)
      .def_prop_ro("has_crc", &Dataset::has_crc)
      .def_prop_ro("path", &Dataset::path)
      .def(
          "page_cache",
          [](const Dataset& d) {
            nb::list out;
            for (const Dataset::ShardCache& s : d.page_cache())
              out.append(nb::make_tuple(s.path, s.bytes, s.resident));
            return out;
          },
          "[(shard path, bytes, bytes in the page cache)]")
      .def("record",
           [](const Dataset& d, int64_t i) {
             if (i < 0 || i >= d.size()) throw nb::index_error("sample index out of range");
             const format::SampleRecord& r = d.record(i);
             nb::dict out;
             out["key"] = r.key;
             out["label"] = r.label;
             out["offset"] = r.offset;
             out["size"] = r.size;
             out["crc32c"] = r.crc32c;
             out["format"] = std::string(image_format_extension(r.format));
             out["shard"] = d.shard_name(i);
             return out;
           })
      .def(
          "read",
          [](const Dataset& d, int64_t i) {
            if (i < 0 || i >= d.size()) throw nb::index_error("sample index out of range");
            const format::SampleRecord& r = d.record(i);
            std::vector<uint8_t> bytes;
            {
              nb::gil_scoped_release release;
              d.shard_file(i).read(r.offset, r.size, bytes);
            }
            return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          "The stored image bytes of sample i.");

  nb::class_<format::ShardWriter>(m, "ShardWriter")
      .def(nb::init<std::string, std::string>(), nb::arg("tar_path"), nb::arg("index_path"))
      .def(
          "add",
          [](format::ShardWriter& w, const std::string& key, nb::bytes data, int64_t label) {
            const auto* p = static_cast<const uint8_t*>(data.data());
            const ImageFormat f = sniff_image_format(p, data.size());
            w.add(key, f, p, data.size(), label);
          },
          nb::arg("key"), nb::arg("data"), nb::arg("label"))
      .def_prop_ro("bytes_written", &format::ShardWriter::bytes_written)
      .def_prop_ro("num_samples", &format::ShardWriter::num_samples)
      .def("finish", &format::ShardWriter::finish, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace stoker::bindings
