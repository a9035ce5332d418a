#pragma once

// The media readers as the engine's media plugin (core/media_plugin.h): what stoker._media hands
// to the Video and Audio fields.

#include "stoker/core/media_plugin.h"

namespace stoker::media {

// The table, filled in once; it lives as long as the process.
const StokerMediaPlugin* plugin();

}  // namespace stoker::media
