#include "bindings.h"

NB_MODULE(_core, m) {
  m.doc() = "stoker's C++ engine. Use the stoker package, not this module.";
  stoker::bindings::register_errors(m);
  stoker::bindings::register_dataset(m);
  stoker::bindings::register_loader(m);
  stoker::bindings::register_tools(m);
}
