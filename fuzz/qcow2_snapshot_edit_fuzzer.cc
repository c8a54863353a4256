// libFuzzer target: the snapshot table parser and the offline snapshot
// editor (formats/qcow2_snapshot_edit.h) on the input bytes as an image.
// The first input byte picks the operation (create, delete, rename,
// rollback keeping or discarding newer snapshots) and the rest is the
// image: every structure the edit reads is untrusted. It also lists,
// measures and reads the image at its first snapshot. Errors are fine;
// crashes, sanitizer reports, hangs, and an edit that turns an image the
// checker finds clean into one with corruptions are not.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "blockio/memory.h"
#include "formats/image.h"
#include "formats/qcow2_check.h"
#include "formats/qcow2_snapshot_edit.h"
#include "formats/qcow2_snapshot_metrics.h"

namespace {

using barge::MemorySink;
using barge::MemorySource;
using barge::Status;
namespace formats = barge::formats;

bool CleanOf(const std::vector<std::byte>& bytes) {
  MemorySource source(bytes, "fuzz.qcow2");
  formats::qcow2::CheckOptions options;
  options.max_file_clusters = 1 << 20;
  options.max_scan_bytes = 256 << 20;
  auto report = formats::qcow2::CheckQcow2(source, options);
  return report.ok() && report->corruptions == 0;
}

Status Edit(uint8_t op, barge::BlockSource& source, barge::BlockSink& sink, const std::string& first) {
  switch (op % 5) {
    case 0: {
      formats::SnapshotCreateSpec spec;
      spec.name = "fuzz";
      auto r = formats::CreateSnapshot(source, sink, spec);
      return r.ok() ? Status() : Status(r.error());
    }
    case 1: {
      auto r = formats::DeleteSnapshot(source, sink, first);
      return r.ok() ? Status() : Status(r.error());
    }
    case 2: {
      auto r = formats::RenameSnapshot(source, sink, first, "renamed");
      return r.ok() ? Status() : Status(r.error());
    }
    default: {
      auto r = formats::RollbackSnapshot(source, sink, first, op % 5 == 4);
      return r.ok() ? Status() : Status(r.error());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t op = data[0];
  const std::byte* p = reinterpret_cast<const std::byte*>(data + 1);
  std::vector<std::byte> bytes(p, p + size - 1);
  MemorySource source(bytes, "fuzz.qcow2");

  std::string first;
  if (auto list = formats::ListSnapshots(source); list.ok() && !list->empty()) first = (*list)[0].id;
  formats::SnapshotMetricsOptions metrics_options;
  metrics_options.max_file_clusters = 1 << 20;
  if (auto m = formats::ComputeSnapshotMetrics(source, metrics_options); !m.ok()) {
    // Refusing the input is a valid outcome.
  }
  if (!first.empty()) {
    formats::OpenOptions o;
    o.format = formats::ImageFormat::kQcow2;
    o.open_backing = false;
    o.open_data_file = false;
    o.snapshot = first;
    auto opener = [&bytes](const std::string& path) -> barge::Result<std::unique_ptr<barge::BlockSource>> {
      return std::unique_ptr<barge::BlockSource>(std::make_unique<MemorySource>(bytes, path));
    };
    if (auto image = formats::OpenImage("/fuzz.qcow2", opener, o); image.ok() && (*image)->size_bytes() > 0) {
      std::vector<std::byte> buf(std::min<uint64_t>((*image)->size_bytes(), 64 << 10));
      if (!(*image)->ReadAt(0, buf).ok()) {
        // Corrupt tables are refused; fine.
      }
    }
  }

  MemorySink sink(0, "fuzz.qcow2");
  if (!bytes.empty() && !sink.WriteAt(0, bytes).ok()) return 0;
  const bool was_clean = CleanOf(bytes);
  Status s = Edit(op, source, sink, first.empty() ? "1" : first);
  if (!s.ok()) return 0;
  // An edit of a clean image leaves a clean image.
  if (was_clean && !CleanOf(sink.contents())) std::abort();
  return 0;
}
