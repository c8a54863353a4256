// What an NBD source or sink's connections did, for tests and reports
// (kept out of blockio/nbd.h, which much of the tree includes).
#pragma once

#include <cstddef>

#include "blockio/sink.h"
#include "blockio/source.h"

namespace barge {

// The most NBD commands seen in flight at once on one connection of an NBD
// source or sink (OpenNbd, OpenNbdSink) since it opened; 0 for anything
// else. Concurrent calls share the connections: their commands are queued
// together, up to 64 per connection, so the queue does not drain between
// one call and the next (issue 41).
size_t NbdMaxInFlight(const BlockSource& source);
size_t NbdMaxInFlight(const BlockSink& sink);

}  // namespace barge
