#include "bindings.h"

NB_MODULE(_core, m) {
  m.doc() = "stoker's C++ engine. Use the stoker package, not this module.";
  // Loaders alive at interpreter exit are closed by their finalisers; no leak report wanted.
  nanobind::set_leak_warnings(false);
  stoker::bindings::register_errors(m);
  stoker::bindings::register_dataset(m);
  stoker::bindings::register_augment(m);
  stoker::bindings::register_faults(m);
  stoker::bindings::register_fields(m);
  stoker::bindings::register_loader(m);
  stoker::bindings::register_sequence(m);
  stoker::bindings::register_tools(m);
  stoker::bindings::register_verify(m);
}
