// Making the destination a copy job writes: a qcow2 image (optionally naming
// a backing file), a qcow2 overlay that stores only part of the disk, or the
// raw guest bytes, from one small spec instead of formats::Qcow2WriterOptions
// filled in by hand in every job.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "blockio/extent.h"
#include "blockio/sink.h"
#include "formats/image.h"
#include "formats/qcow2_writer.h"
#include "pipeline/destination.h"

namespace barge::pipeline {

enum class DestinationFormat : uint8_t { kRaw, kQcow2 };

struct DestinationSpec {
  DestinationFormat format = DestinationFormat::kQcow2;
  uint64_t virtual_size = 0;  // the guest size
  // qcow2 only from here on, but for skip_zeroes_if_zero_initialized.
  uint32_t cluster_bytes = 64 << 10;  // power of two from 512 to 2M
  ZeroPolicy zero_policy = ZeroPolicy::kOmit;
  // The header's compression type (what compressed clusters hold); kNone:
  // every cluster is stored raw.
  formats::Compression compression = formats::Compression::kNone;
  // The backing file the image names (stored as is, relative to the image)
  // and its format ("qcow2" when empty). An incremental backup names its
  // parent and is written whole over its work set; an overlay (below) also
  // leaves clusters to it.
  std::string backing_file;
  std::string backing_format;
  // An overlay (needs backing_file): store only the clusters overlapping
  // `overlay_allocated` (normalized, as from TopLayerAllocation), or those
  // that read differently from `overlay_diff_against` (the image the backing
  // name refers to). At most one; both must outlive the destination.
  const RangeList* overlay_allocated = nullptr;
  formats::Image* overlay_diff_against = nullptr;
  // Persistent bitmaps the image carries.
  std::vector<formats::BitmapSpec> bitmaps;
  // Raw only: see RawDestinationOptions (false over an existing device or
  // export, whose old bytes must be zeroed).
  bool skip_zeroes_if_zero_initialized = true;
};

// The qcow2 writer's options for `spec` (a qcow2 one); kInvalidArgument
// for a bad cluster size.
Result<formats::Qcow2WriterOptions> Qcow2OptionsFor(const DestinationSpec& spec);

// The destination `spec` describes, writing into `sink` (which must outlive
// it): RawDestination, Qcow2Destination or OverlayQcow2Destination.
// kInvalidArgument for a cluster size that is not a power of two from 512 to
// 2M, an overlay without a backing file or with both kinds of selection; the
// qcow2 writer's own refusals (formats::Qcow2Writer::Create).
Result<std::unique_ptr<Destination>> MakeDestination(BlockSink& sink, DestinationSpec spec);

}  // namespace barge::pipeline
