#include "stoker/format/dataset.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "arrow_c.h"
#include "bindings.h"
#include "stoker/core/error.h"
#include "stoker/format/shard_writer.h"
#include "stoker/io/shard_gate.h"

namespace nb = nanobind;

namespace stoker::bindings {
namespace {

// A shard number from Python, checked: an IndexError past the dataset's shards.
void check_shard(const format::Dataset& d, uint32_t shard) {
  if (shard >= d.num_shards()) throw nb::index_error("shard index out of range");
}

// One column of a decoded row group handed over through the Arrow C Data Interface: the array
// is moved out of its capsule (the capsule then releases nothing) and released when the row
// group is freed, on whichever thread drops it last (pyarrow's release needs no GIL). The
// cells' bytes stay in Arrow's buffer; the offsets (8 bytes a row) and the validity (1) are
// copied, rebased and checked by io::RowGroup. `format` is what the Python side cast the
// column to: "Z" (large binary), a number's ("l", "i", "f"...), or "+L" (large list) of one.
// The Arrow format string of a number of this type.
std::string arrow_format(DType t) {
  switch (t) {
    case DType::kInt8: return "c";
    case DType::kUInt8: return "C";
    case DType::kInt16: return "s";
    case DType::kUInt16: return "S";
    case DType::kInt32: return "i";
    case DType::kUInt32: return "I";
    case DType::kInt64: return "l";
    case DType::kUInt64: return "L";
    case DType::kFloat16: return "e";
    case DType::kFloat32: return "f";
    case DType::kFloat64: return "g";
    default: return "?";
  }
}

io::RowGroup::Column arrow_column(const std::string& source, int64_t rows, const std::string& name,
                                  const std::string& kind, const std::string& dtype,
                                  nb::capsule schema_capsule, nb::capsule array_capsule) {
  auto corrupt = [&](const std::string& why) {
    return Error(ErrorCode::kCorruptData, "column '" + name + "': " + why, source, {}, name);
  };
  if (std::string(schema_capsule.name()) != "arrow_schema" ||
      std::string(array_capsule.name()) != "arrow_array")
    throw Error(ErrorCode::kInvalidArgument, "not Arrow C Data Interface capsules");
  const auto* schema = static_cast<const ArrowSchema*>(schema_capsule.data());
  auto* given = static_cast<ArrowArray*>(array_capsule.data());
  if (given->release == nullptr) throw Error(ErrorCode::kInvalidArgument, "a released array");
  // Moved out: the capsule's struct is marked released, ours releases it with the row group.
  auto* moved = new ArrowArray(*given);
  given->release = nullptr;
  std::shared_ptr<ArrowArray> array(moved, [](ArrowArray* a) {
    if (a->release != nullptr) a->release(a);
    delete a;
  });
  io::RowGroup::Column c;
  c.name = name;
  const auto type = dtype_from_name(dtype);
  if (!type) throw Error(ErrorCode::kInvalidArgument, "unknown dtype '" + dtype + "'");
  c.dtype = *type;
  const std::string format = schema->format ? schema->format : "";
  const int64_t n = array->length, at = array->offset;
  if (n != rows || at < 0)
    throw corrupt(std::to_string(n) + " rows where " + std::to_string(rows) + " are");
  auto validity = [&](const ArrowArray& a) {
    if (a.null_count == 0 || a.n_buffers < 1 || a.buffers[0] == nullptr) return;
    const auto* bits = static_cast<const uint8_t*>(a.buffers[0]);
    c.present.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      const int64_t bit = a.offset + r;
      c.present[static_cast<size_t>(r)] = (bits[bit >> 3] >> (bit & 7)) & 1;
    }
  };
  // Offsets in elements of `item` bytes, rebased to the first: the data is what they span.
  auto offsets = [&](const int64_t* o, uint64_t item) {
    if (o == nullptr) throw corrupt("no offsets");
    c.offsets.resize(static_cast<size_t>(n) + 1);
    const int64_t first = o[at];
    for (int64_t r = 0; r <= n; ++r)
      c.offsets[static_cast<size_t>(r)] = static_cast<uint64_t>(o[at + r] - first) * item;
    return first;
  };
  if (kind == "bytes") {
    if (format != "Z" || array->n_buffers != 3)
      throw corrupt("not large binary ('" + format + "')");
    c.kind = io::RowGroup::CellKind::kBytes;
    const int64_t first = offsets(static_cast<const int64_t*>(array->buffers[1]), 1);
    c.external = static_cast<const uint8_t*>(array->buffers[2]);
    if (c.external != nullptr) c.external += first;
  } else if (kind == "number") {
    if (format != arrow_format(c.dtype) || array->n_buffers != 2)
      throw corrupt("not " + dtype + " values ('" + format + "')");
    c.kind = io::RowGroup::CellKind::kNumber;
    c.external = static_cast<const uint8_t*>(array->buffers[1]);
    if (c.external != nullptr) c.external += static_cast<uint64_t>(at) * dtype_size(c.dtype);
    c.external_size = static_cast<uint64_t>(n) * dtype_size(c.dtype);
  } else if (kind == "list") {
    if (format != "+L" || schema->n_children != 1 || array->n_buffers != 2 ||
        array->n_children != 1 || array->children[0]->n_buffers != 2 ||
        std::string(schema->children[0]->format) != arrow_format(c.dtype))
      throw corrupt("not a large list of " + dtype + " ('" + format + "')");
    c.kind = io::RowGroup::CellKind::kList;
    const ArrowArray& values = *array->children[0];
    const uint64_t item = dtype_size(c.dtype);
    const auto* o = static_cast<const int64_t*>(array->buffers[1]);
    const int64_t first = offsets(o, item);
    // Each row's elements lie inside the values; a null element has no value to give, and is
    // refused where its row is not null itself (a null row's elements, such as a fixed-size
    // list's left under it, are never read).
    const auto* row_bits =
        array->null_count != 0 ? static_cast<const uint8_t*>(array->buffers[0]) : nullptr;
    const auto* value_bits =
        values.null_count != 0 ? static_cast<const uint8_t*>(values.buffers[0]) : nullptr;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t lo = o[at + r], hi = o[at + r + 1], bit = at + r;
      if (lo < 0 || hi < lo || hi > values.length)
        throw corrupt("row " + std::to_string(r) + "'s list lies outside its values");
      if (value_bits == nullptr ||
          (row_bits != nullptr && !((row_bits[bit >> 3] >> (bit & 7)) & 1)))
        continue;
      for (int64_t e = lo; e < hi; ++e) {
        const int64_t v = values.offset + e;
        if (!((value_bits[v >> 3] >> (v & 7)) & 1))
          throw corrupt("row " + std::to_string(r) + "'s list holds a null");
      }
    }
    c.external = static_cast<const uint8_t*>(values.buffers[1]);
    if (c.external != nullptr) c.external += static_cast<uint64_t>(values.offset + first) * item;
  } else {
    throw Error(ErrorCode::kInvalidArgument, "unknown cell kind '" + kind + "'");
  }
  if (kind != "number") c.external_size = c.offsets.back();
  validity(*array);
  c.owner = std::move(array);
  return c;
}

}  // namespace

void register_dataset(nb::module_& m) {
  using format::Dataset;
  nb::class_<Dataset>(m, "Dataset")
      .def_static(
          "open",
          [](const std::string& path, int64_t seq_len, std::optional<std::string> token_dtype,
             bool sidecars) {
            format::DatasetOptions options;
            options.seq_len = seq_len;
            options.sidecars = sidecars;
            if (token_dtype) {
              options.token_dtype = dtype_from_name(*token_dtype);
              if (!options.token_dtype)
                throw stoker::Error(stoker::ErrorCode::kInvalidArgument,
                                    "unknown dtype '" + *token_dtype + "'");
            }
            nb::gil_scoped_release release;
            return Dataset::open(path, options);
          },
          nb::arg("path"), nb::arg("seq_len") = 0, nb::arg("token_dtype") = nb::none(),
          nb::arg("sidecars") = true,
          "A pack (tar, array or token pack), a .tar, a folder of .tar shards, or a token file "
          "(.bin, .npy); token data is read in windows of seq_len + 1 tokens. sidecars=False: "
          "a tar pack without its attached columns (attached.json).")
      .def_static("open_tars", &Dataset::open_tars, nb::arg("tar_paths"),
                  nb::call_guard<nb::gil_scoped_release>())
      .def_static(
          "open_fetched",
          [](const std::string& path, int64_t seq_len) {
            format::DatasetOptions options;
            options.seq_len = seq_len;
            nb::gil_scoped_release release;
            return Dataset::open_fetched(path, options);
          },
          nb::arg("path"), nb::arg("seq_len") = 0,
          "A pack folder in a cache (manifest.json and the indexes) whose shards arrive "
          "through .gate while it is read.")
      .def_static(
          "open_row_groups",
          [](const std::string& path,
             const std::vector<std::tuple<std::string, int64_t, int64_t, std::vector<std::string>>>&
                 row_groups,
             std::vector<std::string> classes) {
            std::vector<Dataset::RowGroupInfo> infos;
            infos.reserve(row_groups.size());
            for (const auto& [name, rows, first_row, columns] : row_groups)
              infos.push_back({name, rows, first_row, columns});
            nb::gil_scoped_release release;
            return Dataset::open_row_groups(path, std::move(infos), std::move(classes));
          },
          nb::arg("path"), nb::arg("row_groups"), nb::arg("classes"),
          "Parquet row groups as shards: (name, rows, first row in its file, columns) each; "
          "their decoded columns arrive through .gate (ShardGate.ready_rows).")
      .def_prop_ro("gate", &Dataset::gate)
      .def(
          "verify_shard",
          [](const Dataset& d, uint32_t shard, const std::string& path) {
            nb::gil_scoped_release release;
            check_shard(d, shard);
            const io::ShardFile file(path);
            const Dataset::FileInfo& info = d.shard_files(shard).at(0);
            if (file.size() != info.bytes)
              throw stoker::Error(stoker::ErrorCode::kCorruptData,
                                  std::to_string(file.size()) + " bytes, the manifest says " +
                                      std::to_string(info.bytes),
                                  info.name);
            d.verify_shard_file(shard, file);
          },
          nb::arg("shard"), nb::arg("path"),
          "Checks the file at path against shard's index: its size, and every member's CRC32C.")
      .def(
          "resident",
          [](const Dataset& d) {
            if (d.gate())
              throw stoker::Error(stoker::ErrorCode::kInvalidArgument,
                                  "a pack at a URL is not read into memory whole");
            nb::gil_scoped_release release;
            return d.resident([] { return true; });
          },
          "This dataset with every data file read into memory now.")
      .def_prop_ro("resident_bytes", &Dataset::resident_bytes,
                   "The bytes resident() holds: the data files' sizes.")
      .def(
          "verify_file",
          [](const Dataset& d, uint32_t entry, const std::string& path) {
            nb::gil_scoped_release release;
            const io::ShardFile file(path);
            d.verify_file(entry, file);
          },
          nb::arg("entry"), nb::arg("path"),
          "Checks the file at path as the data file of gate entry `entry` (its size, a tar's "
          "members' CRC32C, a column's header, the file's CRC32C).")
      .def("__len__", &Dataset::size)
      .def_prop_ro("classes", &Dataset::classes)
      .def_prop_ro("attached", &Dataset::attached,
                   "The names of the sidecars attached to this pack (stoker.attach), in order.")
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
             nb::dict out;
             out["key"] = d.key(i);
             out["label"] = d.label(i);
             out["shard"] = d.shard_name(i);
             nb::list members;
             bool image = false;
             std::vector<format::MemberRef> refs;
             d.members(i, refs);
             for (const format::MemberRef& m : refs) {
               const std::string name(m.name);
               nb::dict member;
               member["name"] = name;
               member["file"] = d.shard_files(d.shard_of(i)).at(m.file).name;
               member["offset"] = m.offset;
               member["size"] = m.size;
               if (m.has_crc) member["crc32c"] = m.crc32c;
               if (m.image_size.known()) {
                 member["width"] = m.image_size.width;
                 member["height"] = m.image_size.height;
               }
               if (m.raw) {
                 member["dtype"] = std::string(dtype_name(m.raw->dtype));
                 member["shape"] = m.raw->shape;
               }
               members.append(member);
               if (!image && !m.raw && format::is_image_member_name(name)) {  // the image
                 image = true;
                 out["offset"] = m.offset;
                 out["size"] = m.size;
                 out["crc32c"] = m.crc32c;
                 out["format"] = name.substr(name.rfind('.') + 1);
               }
             }
             out["members"] = members;
             return out;
           })
      .def(
          "read",
          [](const Dataset& d, int64_t i, std::optional<std::string> member) {
            if (i < 0 || i >= d.size()) throw nb::index_error("sample index out of range");
            std::vector<format::MemberRef> refs;
            d.members(i, refs);
            const format::MemberRef* found = nullptr;
            for (const format::MemberRef& m : refs) {
              if (member ? m.name == *member : (!m.raw && format::is_image_member_name(m.name))) {
                found = &m;
                break;
              }
            }
            if (!found)
              throw stoker::Error(
                  stoker::ErrorCode::kInvalidArgument,
                  member ? "no member '" + *member + "'" : std::string("no image member"),
                  d.shard_name(i), d.key(i));
            std::vector<uint8_t> bytes;
            {
              nb::gil_scoped_release release;
              d.file(i, found->file)->read(found->offset, found->size, bytes);
            }
            return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          nb::arg("i"), nb::arg("member") = nb::none(),
          "The stored bytes of sample i's member (by default its image).")
      .def(
          "image_sizes",
          [](const Dataset& d, uint32_t shard, const std::vector<std::string>& members) {
            check_shard(d, shard);
            auto* hw = new std::vector<int64_t>();
            format::SizeSource source;
            {
              nb::gil_scoped_release release;
              const std::vector<ImageSize> sizes = d.image_sizes(shard, members, &source);
              hw->reserve(sizes.size() * 2);
              for (const ImageSize& s : sizes) {
                hw->push_back(s.height);
                hw->push_back(s.width);
              }
            }
            nb::capsule owner(
                hw, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
            const size_t n = hw->size() / 2;
            return nb::make_tuple(
                nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>(hw->data(), {n, size_t{2}}, owner),
                std::string(format::size_source_name(source)));
          },
          nb::arg("shard"), nb::arg("members"),
          "(sizes, source): each sample's (height, width) of the first of `members` it has "
          "(0, 0: none, or unknown), int64 [n, 2], and where they were found: 'index', 'sizes "
          "file', 'headers' (read from the images now), 'layout' (an array pack's column) or "
          "'none'.")
      .def(
          "shard_files",
          [](const Dataset& d, uint32_t shard) {
            check_shard(d, shard);
            nb::list out;
            for (const Dataset::FileInfo& f : d.shard_files(shard)) {
              nb::dict file;
              file["name"] = f.name;
              file["bytes"] = f.bytes;
              file["crc32c"] = f.crc32c ? nb::cast(*f.crc32c) : nb::none();
              file["gate_entry"] = f.gate_entry;
              out.append(file);
            }
            return out;
          },
          nb::arg("shard"),
          "The shard's data files: name, bytes, crc32c (a column's or token file's, or None) and "
          "gate entry.")
      .def(
          "layout",
          [](const Dataset& d, uint32_t shard) {
            check_shard(d, shard);
            return std::string(format::shard_layout_name(d.layout(shard)));
          },
          nb::arg("shard"), "'tar', 'columns', 'tokens' or 'row group'")
      .def(
          "shard_tokens",
          [](const Dataset& d, uint32_t shard) {
            check_shard(d, shard);
            return d.shard_tokens(shard);
          },
          nb::arg("shard"), "A token shard's tokens; 0 for other shards.")
      .def(
          "token_source",
          [](const Dataset& d, uint32_t shard) {
            check_shard(d, shard);
            const Dataset::TokenSource t = d.token_source(shard);
            return nb::make_tuple(t.path, t.offset, std::string(dtype_name(t.dtype)));
          },
          nb::arg("shard"), "A token shard's (file path, offset of token 0, dtype name).")
      .def(
          "member_names",
          [](const Dataset& d, uint32_t shard) {
            check_shard(d, shard);
            return d.member_names(shard);
          },
          nb::arg("shard"),
          "The member names a tar shard's index holds (any of its samples'), its sidecars' not "
          "included.")
      .def(
          "keys",
          [](const Dataset& d, uint32_t shard) {
            check_shard(d, shard);
            std::vector<std::string> keys;
            const int64_t first = d.shard_first(shard), n = d.shard_samples(shard);
            keys.reserve(static_cast<size_t>(n));
            for (int64_t i = first; i < first + n; ++i) keys.push_back(d.key(i));
            return keys;
          },
          nb::arg("shard"), "The keys of a shard's samples, in order.")
      .def(
          "shard_samples",
          [](const Dataset& d, uint32_t shard) {
            check_shard(d, shard);
            return d.shard_samples(shard);
          },
          nb::arg("shard"));

  m.def("write_foreign_shard_index", &format::write_foreign_shard_index, nb::arg("tar_path"),
        nb::arg("index_path"), nb::call_guard<nb::gil_scoped_release>(),
        "Writes the index of a WebDataset tar stoker did not write, with every member's CRC32C; "
        "returns its number of samples.");

  m.def(
      "shard_index_samples",
      [](const std::string& index_path, uint64_t shard_bytes) {
        const std::vector<uint8_t> bytes = io::read_file(index_path);
        return format::parse_shard_index(bytes.data(), bytes.size(), shard_bytes, index_path)
            .samples.size();
      },
      nb::arg("index_path"), nb::arg("shard_bytes"), nb::call_guard<nb::gil_scoped_release>(),
      "The number of samples of a shard index, checked against its shard's size in bytes.");

  using io::ShardGate;
  nb::class_<ShardGate>(m, "ShardGate")
      .def_prop_ro("num_shards", &ShardGate::num_shards)
      .def("ready", &ShardGate::ready, nb::arg("shard"), nb::arg("path"),
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "ready_rows",
          [](ShardGate& g, uint32_t shard, const std::string& source, int64_t rows,
             const std::vector<std::tuple<std::string, std::string, std::string, nb::capsule,
                                          nb::capsule>>& columns,
             const std::string& error) {
            if (!error.empty()) {
              nb::gil_scoped_release release;
              return g.ready_rows(shard, std::make_shared<const io::RowGroup>(source, rows, error));
            }
            std::vector<io::RowGroup::Column> out;
            for (const auto& [name, kind, dtype, schema, array] : columns)
              out.push_back(arrow_column(source, rows, name, kind, dtype, schema, array));
            nb::gil_scoped_release release;  // the checks; the buffers are Arrow's, no GIL
            g.ready_rows(shard, std::make_shared<const io::RowGroup>(source, rows, std::move(out)));
          },
          nb::arg("shard"), nb::arg("source"), nb::arg("rows"), nb::arg("columns"),
          nb::arg("error") = "",
          "The shard is this decoded row group: per column (name, 'bytes' | 'number' | 'list', "
          "dtype, its Arrow schema and array capsules (__arrow_c_array__): large binary, a "
          "number, or a large list of numbers), the array moved out of its capsule and its "
          "buffers read in place; with `error`, one that did not decode, each of its rows "
          "failing with CorruptDataError(error). A bad length or offset is CorruptDataError "
          "naming source and the column.")
      .def("is_ready", &ShardGate::is_ready, nb::arg("shard"))
      .def("failed", &ShardGate::failed, nb::arg("shard"), nb::arg("reason"),
           nb::call_guard<nb::gil_scoped_release>())
      .def("evict", &ShardGate::evict, nb::arg("shard"), nb::call_guard<nb::gil_scoped_release>())
      .def("wait_for_requests", &ShardGate::wait_for_requests, nb::arg("timeout_ms"),
           nb::call_guard<nb::gil_scoped_release>())
      .def("close", &ShardGate::close, nb::call_guard<nb::gil_scoped_release>())
      .def("stats", [](const ShardGate& g) {
        const ShardGate::Stats s = g.stats();
        nb::dict out;
        out["waits"] = s.waits;
        out["wait_s"] = static_cast<double>(s.wait_ns) * 1e-9;
        out["ready"] = s.ready;
        out["evicted"] = s.evicted;
        return out;
      });

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
      .def(
          "add_sample",
          [](format::ShardWriter& w, const std::string& key,
             const std::vector<std::pair<std::string, nb::bytes>>& members, int64_t label) {
            std::vector<format::ShardWriter::MemberData> data;
            for (const auto& [name, bytes] : members)
              data.push_back({name, static_cast<const uint8_t*>(bytes.data()), bytes.size()});
            w.add_sample(key, data, label);
          },
          nb::arg("key"), nb::arg("members"), nb::arg("label") = -1,
          "Appends KEY.<name> for each (name, bytes), and KEY.cls for a label >= 0.")
      .def_prop_ro("bytes_written", &format::ShardWriter::bytes_written)
      .def_prop_ro("num_samples", &format::ShardWriter::num_samples)
      .def("finish", &format::ShardWriter::finish, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace stoker::bindings
