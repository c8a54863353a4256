// What a replicate run's options and result come to, decided here so the
// cli only declares the flags and prints: which copies take qcow2 shaping
// flags, and the run's one error when not every copy was made ready.
#pragma once

#include <string>

#include "blockio/error.h"
#include "pipeline/replicate.h"

namespace barge::pipeline {

// --compress and --cluster-size shape qcow2 copies only: the copies are
// qcow2 when `format` says so, or keeps a qcow2 source's format.
// Returns kInvalidArgument (naming the flag given, `format_flag` as the
// user wrote --format and the source's format) for raw copies.
Status CheckQcow2Shaping(ReplicaFormat format, const std::string& format_flag, const std::string& source_format,
                         bool compress_given, bool cluster_size_given);

// The run's error when `r` is not all ready (`source` names the source
// for the user, without secrets):
//   kCorruption: the source's SHA-512 is not `expected_sha512` (nothing
//     was made ready);
//   the first failed copy's code and file, its message prefixed by "N of
//     M copies failed"; kIoError with the count when no copy says why.
// OkStatus when every copy is ready.
Status ReplicateOutcome(const ReplicateResult& r, const std::string& expected_sha512, const std::string& source);

}  // namespace barge::pipeline
