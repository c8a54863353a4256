// MakeDestination: the one place a job's destination is put together.
#include "pipeline/destination_spec.h"

#include "formats/qcow2_format.h"
#include "pipeline/overlay_destination.h"

namespace barge::pipeline {

Result<formats::Qcow2WriterOptions> Qcow2OptionsFor(const DestinationSpec& spec) {
  formats::Qcow2WriterOptions w;
  w.virtual_size = spec.virtual_size;
  BARGE_ASSIGN_OR_RETURN(w.cluster_bits, formats::qcow2::ClusterBitsOf(spec.cluster_bytes));
  w.compression = spec.compression;
  w.bitmaps = spec.bitmaps;
  if (!spec.backing_file.empty()) {
    w.backing_file = spec.backing_file;
    w.backing_format = spec.backing_format.empty() ? "qcow2" : spec.backing_format;
  }
  return w;
}

Result<std::unique_ptr<Destination>> MakeDestination(BlockSink& sink, DestinationSpec spec) {
  if (spec.format == DestinationFormat::kRaw) {
    RawDestinationOptions r;
    r.virtual_size = spec.virtual_size;
    r.skip_zeroes_if_zero_initialized = spec.skip_zeroes_if_zero_initialized;
    return std::unique_ptr<Destination>(std::make_unique<RawDestination>(sink, r));
  }
  BARGE_ASSIGN_OR_RETURN(formats::Qcow2WriterOptions w, Qcow2OptionsFor(spec));
  if (spec.overlay_allocated != nullptr && spec.overlay_diff_against != nullptr) {
    return Error::InvalidArgument("an overlay stores either a top layer's clusters or what differs, not both")
        .set_path(sink.name());
  }
  if (spec.overlay_allocated != nullptr) {
    BARGE_ASSIGN_OR_RETURN(auto d, OverlayQcow2Destination::Create(sink, std::move(w), *spec.overlay_allocated));
    return std::unique_ptr<Destination>(std::move(d));
  }
  if (spec.overlay_diff_against != nullptr) {
    BARGE_ASSIGN_OR_RETURN(auto d, OverlayQcow2Destination::CreateDiff(sink, std::move(w), *spec.overlay_diff_against));
    return std::unique_ptr<Destination>(std::move(d));
  }
  BARGE_ASSIGN_OR_RETURN(auto d, Qcow2Destination::Create(sink, std::move(w), spec.zero_policy));
  return std::unique_ptr<Destination>(std::move(d));
}

}  // namespace barge::pipeline
