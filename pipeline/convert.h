// The convert job: any image (raw, qcow2 chain, block device, NBD export)
// copied whole into a raw or qcow2 file or a block device.
#pragma once

#include <cstdint>
#include <string>

#include "blockio/env.h"
#include "formats/digest.h"
#include "pipeline/copy.h"
#include "pipeline/destination_spec.h"
#include "pipeline/endpoints.h"
#include "pipeline/file_access.h"

namespace barge::pipeline {

struct ConvertRequest {
  SourceSpec source;
  std::string destination;  // file path or block device
  DestinationFormat format = DestinationFormat::kRaw;  // qcow2: files only
  // qcow2: the backing file the output names (relative to the output) and
  // its format ("" = qcow2); only the clusters that read differently from it
  // are stored (as qemu-img convert -B does). Opened under the source's
  // path policy.
  std::string backing;
  std::string backing_format;
  bool force = false;  // replace an existing output file
  // Who may read an output file made anew (OutputSpec::access): private
  // unless `--group`.
  FileAccess access = FileAccess::Private();
  bool sync = true;    // false: no fsync at the end (see StagedFile::Create)
  // Cluster size, chunk size, threads, memory, compression (qcow2 output
  // only), progress and cancel, as given.
  CopyOptions copy;
};

// The option combinations convert refuses before opening anything, as
// kInvalidArgument with the text the cli prints as its usage error:
// compression, a backing file or a cluster size without a qcow2 output
// (`format`), a backing format without a backing file.
Status CheckConvertOptions(DestinationFormat format, bool compressed, bool has_backing, bool has_backing_format,
                           bool cluster_size_given);

struct ConvertResult {
  uint64_t virtual_size = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;  // the output file's size; 0 for a block device
  ClusterCounts clusters;
  formats::Digest128 image_digest;
  double seconds = 0;          // of the copy
};

// Opens the source, opens the output (OpenOutput: an existing file needs
// `force`; a block device is written in place, raw only, and must hold the
// disk), makes the destination, copies the whole disk and publishes the
// output. Returns the result, or the first error: the source's, the
// output's (kNotSupported for qcow2 onto a block device), the backing
// image's (wrapped, saying how its name resolves), the copy's.
// Reads and writes through `env`.
Result<ConvertResult> RunConvert(Env& env, const ConvertRequest& request);

}  // namespace barge::pipeline
