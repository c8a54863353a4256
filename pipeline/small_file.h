// Reading the small files of a chain folder (manifests, merge journals,
// extents files) whole, with a bound on their size.
#pragma once

#include <cstdint>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::pipeline {

// Reads a small whole file through `env`; kNotFound / kIoError, and
// kCorruption when it is larger than `max_bytes`.
Result<std::string> ReadSmallFile(Env& env, const std::string& path, uint64_t max_bytes = 16 << 20);

}  // namespace barge::pipeline
