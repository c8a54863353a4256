#include "pipeline/image_report.h"

#include <cstdio>
#include <sstream>

#include "blockio/nbd.h"
#include "formats/units.h"

namespace barge::pipeline {

using formats::HumanBytes;

std::optional<uint64_t> ActualSize(Env& env, const formats::ImageInfo& info) {
  if (IsNbdUri(info.path)) return std::nullopt;
  auto st = env.Stat(info.path);
  if (!st.ok()) return std::nullopt;
  return st->allocated_bytes;
}

std::string MissingBackingFormatFix(const formats::ImageInfo& info) {
  return "backing file '" + info.backing_file +
         "' has no recorded format and barge never probes formats, so the image's data cannot be read; "
         "record it with `qemu-img rebase -u -F <raw|qcow2> -b '" + info.backing_file + "' " + info.path + "`";
}

std::string VmClockText(uint64_t nsec) {
  const uint64_t secs = nsec / 1000000000;
  char text[64];
  std::snprintf(text, sizeof text, "%02llu:%02llu:%02llu.%03llu", static_cast<unsigned long long>(secs / 3600),
                static_cast<unsigned long long>((secs / 60) % 60), static_cast<unsigned long long>(secs % 60),
                static_cast<unsigned long long>((nsec / 1000000) % 1000));
  return text;
}

std::string ImageInfoText(const formats::ImageInfo& info, std::optional<uint64_t> actual) {
  std::ostringstream t;
  t << "image: " << info.path << "\n"
    << "file format: " << formats::ImageFormatName(info.format) << "\n"
    << "virtual size: " << HumanBytes(info.virtual_size) << " (" << info.virtual_size << " bytes)\n";
  // qemu-img's "disk size" is the space the file takes; barge adds the
  // file's length (a sparse file's apparent size).
  if (actual) t << "disk size: " << HumanBytes(*actual) << "\n";
  t << "file length: " << HumanBytes(info.file_size) << "\n";
  if (info.format != formats::ImageFormat::kQcow2) return t.str();
  t << "cluster_size: " << info.cluster_size() << "\n"
    << "version: " << info.version << (info.version >= 3 ? " (compat 1.1)" : " (compat 0.10)") << "\n"
    << "compression type: " << (info.compression == formats::Compression::kZstd ? "zstd" : "zlib") << "\n"
    << "lazy refcounts: " << (info.lazy_refcounts ? "true" : "false") << "\n"
    << "refcount bits: " << info.refcount_bits << "\n";
  if (info.extended_l2) t << "extended l2: true\n";
  if (info.dirty) t << "dirty flag: true\n";
  if (info.corrupt) t << "corrupt: true\n";
  if (!info.backing_file.empty()) {
    t << "backing file: " << info.backing_file;
    if (!info.backing_path.empty()) t << " (actual path: " << info.backing_path << ")";
    t << "\nbacking file format: "
      << (info.backing_format.empty() ? "(not recorded) " + MissingBackingFormatFix(info) : info.backing_format)
      << "\n";
  }
  if (!info.data_file.empty()) {
    t << "data file: " << info.data_file << "\n"
      << "data file raw: " << (info.data_file_raw ? "true" : "false") << "\n";
  }
  if (!info.bitmaps.empty()) {
    t << "bitmaps:\n";
    for (const auto& b : info.bitmaps) {
      t << "  " << b.name << ": granularity " << HumanBytes(b.granularity_bytes)
        << (b.enabled ? ", enabled" : ", disabled") << (b.in_use ? ", IN USE (inconsistent)" : "") << "\n";
    }
  }
  if (!info.snapshots.empty()) {
    // qemu-img's columns; the date in RFC 3339 UTC (qemu prints local time).
    t << "snapshots:\n";
    for (const auto& s : info.snapshots) {
      t << "  " << s.id << "  " << s.name << "  vm state " << HumanBytes(s.vm_state_size) << "  date "
        << formats::FormatRfc3339({static_cast<int64_t>(s.date_sec), 0}) << "  vm clock "
        << VmClockText(s.vm_clock_nsec);
      if (s.icount != UINT64_MAX) t << "  icount " << s.icount;
      t << "\n";
    }
  }
  return t.str();
}

std::string MapText(const std::vector<MapEntry>& extents, const std::vector<std::string>& layer_paths) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-20s%-20s%-8s%-6s%s\n", "Offset", "Length", "Kind", "Depth", "File");
  out += line;
  for (const auto& e : extents) {
    // A hole is allocated in no layer: no file holds its bytes.
    std::string file = e.present ? layer_paths[e.depth] : "-";
    std::string kind = e.data ? "data" : e.present ? "zero" : "hole";
    if (e.compressed) kind += "/z";
    std::snprintf(line, sizeof line, "0x%-18llx0x%-18llx%-8s%-6d", static_cast<unsigned long long>(e.start),
                  static_cast<unsigned long long>(e.length), kind.c_str(), e.depth);
    out += line + file + "\n";
  }
  out += "\nOffset, Length: guest bytes, in hex. Kind: data = stored, data/z = stored compressed,\n"
         "zero = reads as zeros (a zero cluster, or a hole of a raw file),\n"
         "hole = allocated in no layer (reads as zeros).\n"
         "Depth: the layer that answers, 0 = the image itself, 1 = its backing file, and so on;\n"
         "File: that layer's file.\n";
  return out;
}

Result<formats::qcow2::CheckReport> CheckQcow2File(Env& env, const std::string& path) {
  if (IsNbdUri(path)) {
    return Error::NotSupported("check reads a qcow2 file's structure; an NBD export is not a file").set_path(path);
  }
  BARGE_ASSIGN_OR_RETURN(auto file, env.OpenSource(path));
  // Not a qcow2 at all is a wrong input (exit 1), not a damaged image (2).
  auto probed = formats::ProbeFormatName(*file);
  if (!probed.ok()) return Error(probed.error()).set_path(path);
  if (*probed != "qcow2") {
    return Error::InvalidArgument("not a qcow2 image (its first bytes " +
                                  (*probed == "raw" ? std::string("hold no image header: raw")
                                                    : "are a " + *probed + " header") +
                                  "); check inspects qcow2 structure only")
        .set_path(path);
  }
  auto report = formats::qcow2::CheckQcow2(*file);
  if (!report.ok()) return Error(report.error()).set_path(path);
  return *report;
}

std::string CheckReportText(const formats::qcow2::CheckReport& r) {
  std::string t;
  for (const auto& m : r.messages) t += m + "\n";
  if (r.clean()) t += "No errors were found on the image.\n";
  if (r.corruptions) t += std::to_string(r.corruptions) + " errors were found on the image.\n";
  if (r.leaks) t += std::to_string(r.leaks) + " leaked clusters were found on the image.\n";
  if (r.total_clusters) {
    char line[192];
    // qemu-img's line: the fragmented and compressed shares are of the
    // allocated clusters.
    const double total = static_cast<double>(r.total_clusters);
    const double allocated = static_cast<double>(r.allocated_clusters);
    std::snprintf(line, sizeof line, "%llu/%llu = %.2f%% allocated, %.2f%% fragmented, %.2f%% compressed clusters\n",
                  static_cast<unsigned long long>(r.allocated_clusters),
                  static_cast<unsigned long long>(r.total_clusters), 100.0 * allocated / total,
                  allocated ? 100.0 * static_cast<double>(r.fragmented_clusters) / allocated : 0.0,
                  allocated ? 100.0 * static_cast<double>(r.compressed_clusters) / allocated : 0.0);
    t += line;
  }
  if (r.image_end_offset) t += "Image end offset: " + std::to_string(r.image_end_offset) + "\n";
  return t;
}

}  // namespace barge::pipeline
