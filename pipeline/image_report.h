// What `barge info`, `map` and `check` find and say of an image, in
// qemu-img's habits: the layer's text, the extent table, the check's
// verdict lines, and the decisions before a check (an NBD export or a file
// that is not qcow2 is refused, not reported damaged). The cli prints these
// strings; --json is the cli's own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/image.h"
#include "formats/qcow2_check.h"
#include "pipeline/image_inspect.h"

namespace barge::pipeline {

// qemu-img's "disk size" / actual-size: the bytes the file occupies
// (st_blocks, through `env`); nullopt when it cannot be learnt (an NBD
// export, a file that cannot be stat'ed).
std::optional<uint64_t> ActualSize(Env& env, const formats::ImageInfo& info);

// How to record a missing backing format (barge never probes one): the
// sentence with the `qemu-img rebase -u -F` command line.
std::string MissingBackingFormatFix(const formats::ImageInfo& info);

// The guest clock as qemu-img's snapshot table prints it (block/snapshot.c,
// bdrv_snapshot_dump): HH:MM:SS.mmm.
std::string VmClockText(uint64_t nsec);

// `info`'s text of one layer (`actual`: ActualSize of it): format, sizes,
// the qcow2 header's settings, backing file and format (or how to record
// it), data file, bitmaps and snapshots.
std::string ImageInfoText(const formats::ImageInfo& info, std::optional<uint64_t> actual);

// `map`'s table of `extents` (MapImage), `layer_paths` naming each depth's
// file (BackingChain's order), with the legend below it.
std::string MapText(const std::vector<MapEntry>& extents, const std::vector<std::string>& layer_paths);

// `check` of the file at `path`: refused as kNotSupported for an NBD
// export (not a file), as kInvalidArgument for a file that is not qcow2
// (a wrong input, exit 1, not a damaged image); else CheckQcow2's report.
// Errors carry `path`.
Result<formats::qcow2::CheckReport> CheckQcow2File(Env& env, const std::string& path);

// `check`'s text as qemu-img's: the messages, the verdict, the allocation
// line (fragmented and compressed shares of the allocated clusters) and the
// image end offset.
std::string CheckReportText(const formats::qcow2::CheckReport& r);

}  // namespace barge::pipeline
