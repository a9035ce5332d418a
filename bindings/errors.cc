// stoker::Error becomes the Python class for its code (stoker.errors), with shard, key and reason
// as attributes. The classes live in Python so users can import and subclass-check them.
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "stoker/core/error.h"

namespace nb = nanobind;

namespace stoker::bindings {

void register_error_translator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::gil_scoped_acquire gil;  // translators run with the GIL, but be explicit
      nb::object make = nb::module_::import_("stoker.errors").attr("_from_core");
      nb::object exc =
          make(static_cast<int>(e.code()), e.what(), e.reason(), e.shard(), e.key(), e.member());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
}

void register_errors(nb::module_& m) {
  register_error_translator();
  m.attr("ERROR_CODES") = nb::make_tuple("invalid_argument", "corrupt_data", "io", "unsupported",
                                         "resource_limit", "internal", "error_budget");
}

}  // namespace stoker::bindings
