// barge info / map / compare: look at images the way qemu-img does.
#include <optional>
#include <iostream>
#include <vector>

#include "blockio/env.h"
#include "blockio/nbd.h"
#include "cli/common.h"
#include "cli/http_flags.h"
#include "formats/qcow2_check.h"
#include "pipeline/image_inspect.h"

namespace barge::cli {
namespace {

using nlohmann::json;

// As `bitmap list`: qemu-img's "flags" (in-use, auto) as booleans.
json BitmapJson(const formats::BitmapInfo& b) {
  return {{"name", b.name}, {"granularity", b.granularity_bytes}, {"enabled", b.enabled}, {"in_use", b.in_use}};
}

// qemu-img's "disk size" / actual-size: the bytes the file occupies
// (st_blocks); nullopt when it cannot be learnt (an NBD export).
std::optional<uint64_t> ActualSize(const formats::ImageInfo& info) {
  if (IsNbdUri(info.path)) return std::nullopt;
  auto st = Env::Default().Stat(info.path);
  if (!st.ok()) return std::nullopt;
  return st->allocated_bytes;
}

// How to record a missing backing format (barge never probes one).
std::string MissingBackingFormatFix(const formats::ImageInfo& info) {
  return "backing file '" + info.backing_file +
         "' has no recorded format and barge never probes formats, so the image's data cannot be read; "
         "record it with `qemu-img rebase -u -F <raw|qcow2> -b '" + info.backing_file + "' " + info.path + "`";
}

// `actual`: ActualSize(info), learnt once per layer.
json LayerJson(const formats::ImageInfo& info, std::optional<uint64_t> actual) {
  json j = {{"filename", info.path},
            {"format", formats::ImageFormatName(info.format)},
            {"virtual_size", info.virtual_size},
            {"file_size", info.file_size}};
  if (actual) j["actual_size"] = *actual;
  if (info.format != formats::ImageFormat::kQcow2) return j;
  j["version"] = info.version;
  j["cluster_size"] = info.cluster_size();
  j["refcount_bits"] = info.refcount_bits;
  j["compression_type"] = info.compression == formats::Compression::kZstd ? "zstd" : "zlib";
  j["extended_l2"] = info.extended_l2;
  j["lazy_refcounts"] = info.lazy_refcounts;
  j["dirty"] = info.dirty;
  j["corrupt"] = info.corrupt;
  if (!info.backing_file.empty()) {
    j["backing_file"] = info.backing_file;
    j["backing_format"] = info.backing_format;
    j["backing_path"] = info.backing_path;
  }
  if (!info.data_file.empty()) {
    j["data_file"] = info.data_file;
    j["data_file_raw"] = info.data_file_raw;
  }
  j["bitmaps"] = json::array();
  for (const auto& b : info.bitmaps) j["bitmaps"].push_back(BitmapJson(b));
  j["snapshots"] = json::array();
  for (const auto& s : info.snapshots) {
    json sj = {{"id", s.id},
               {"name", s.name},
               {"virtual_size", s.virtual_size},
               {"vm_state_size", s.vm_state_size},
               {"date", formats::FormatRfc3339({static_cast<int64_t>(s.date_sec),
                                                static_cast<int32_t>(s.date_nsec)})},
               {"vm_clock_seconds", static_cast<double>(s.vm_clock_nsec) / 1e9}};
    // qemu-img leaves icount out when the snapshot has none.
    if (s.icount != UINT64_MAX) sj["icount"] = s.icount;
    j["snapshots"].push_back(sj);
  }
  return j;
}

// The guest clock as qemu-img's snapshot table prints it (block/snapshot.c,
// bdrv_snapshot_dump): HH:MM:SS.mmm.
std::string VmClock(uint64_t nsec) {
  const uint64_t secs = nsec / 1000000000;
  return Format("%02llu:%02llu:%02llu.%03llu", static_cast<unsigned long long>(secs / 3600),
                static_cast<unsigned long long>((secs / 60) % 60), static_cast<unsigned long long>(secs % 60),
                static_cast<unsigned long long>((nsec / 1000000) % 1000));
}

void PrintLayerText(const formats::ImageInfo& info, std::optional<uint64_t> actual, std::ostream& t) {
  t << "image: " << info.path << "\n"
    << "file format: " << formats::ImageFormatName(info.format) << "\n"
    << "virtual size: " << HumanBytes(info.virtual_size) << " (" << info.virtual_size << " bytes)\n";
  // qemu-img's "disk size" is the space the file takes; barge adds the
  // file's length (a sparse file's apparent size).
  if (actual) t << "disk size: " << HumanBytes(*actual) << "\n";
  t << "file length: " << HumanBytes(info.file_size) << "\n";
  if (info.format != formats::ImageFormat::kQcow2) return;
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
        << formats::FormatRfc3339({static_cast<int64_t>(s.date_sec), 0}) << "  vm clock " << VmClock(s.vm_clock_nsec);
      if (s.icount != UINT64_MAX) t << "  icount " << s.icount;
      t << "\n";
    }
  }
}

int RunInfo(const std::string& path, const ImageFlags& flags, Output& out) {
  auto options = flags.ToOpenOptions();
  if (!options.ok()) return out.Usage(options.error().message());
  WarnIfMisnamed(out, path, flags.format);
  options->open_data_file = false;  // info never needs the data file's bytes
  // Shown, not read: a layer whose backing format is not recorded ends the
  // chain here, with a warning that says how to record it.
  options->stop_at_unrecorded_backing_format = true;
  auto image = OpenImageFile(path, *options, flags.http);
  if (!image.ok()) return out.Fail(image.error());
  auto chain = pipeline::BackingChain(**image);
  const formats::ImageInfo& last = chain.back()->info();
  if (!last.backing_file.empty() && last.backing_format.empty()) out.Warning(MissingBackingFormatFix(last), last.path);
  // One stat per layer; the top layer is chain[0].
  std::vector<std::optional<uint64_t>> actual;
  for (const auto* layer : chain) actual.push_back(ActualSize(layer->info()));
  json j = LayerJson((*image)->info(), actual[0]);
  j["chain"] = json::array();
  for (size_t i = 0; i < chain.size(); ++i) j["chain"].push_back(LayerJson(chain[i]->info(), actual[i]));
  out.Result(j);
  for (size_t i = 0; i < chain.size(); ++i) {
    if (i > 0) out.text() << "\n";
    PrintLayerText(chain[i]->info(), actual[i], out.text());
  }
  return kExitOk;
}

int RunMap(const std::string& path, const ImageFlags& flags, const std::string& snapshot, Output& out) {
  auto options = flags.ToOpenOptions();
  if (!options.ok()) return out.Usage(options.error().message());
  options->snapshot = snapshot;
  WarnIfMisnamed(out, path, flags.format);
  auto image = OpenImageFile(path, *options, flags.http);
  if (!image.ok()) return out.Fail(image.error());
  auto chain = pipeline::BackingChain(**image);
  auto all = pipeline::MapImage(**image);
  if (!all.ok()) return out.Fail(all.error());
  if (out.json()) {
    json arr = json::array();
    for (const auto& e : *all) {
      json j = {{"start", e.start},
                {"length", e.length},
                {"depth", e.depth},
                {"present", e.present},
                {"zero", e.zero},
                {"data", e.data},
                {"compressed", e.compressed}};
      if (e.offset) {
        j["offset"] = *e.offset;
        j["file"] = e.file;
      }
      arr.push_back(j);
    }
    json result = {{"extents", arr}};
    if (!snapshot.empty()) result["snapshot"] = snapshot;
    out.Result(result);
    return kExitOk;
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-20s%-20s%-8s%-6s%s\n", "Offset", "Length", "Kind", "Depth", "File");
  out.text() << line;
  for (const auto& e : *all) {
    // A hole is allocated in no layer: no file holds its bytes.
    std::string file = e.present ? chain[e.depth]->info().path : "-";
    std::string kind = e.data ? "data" : e.present ? "zero" : "hole";
    if (e.compressed) kind += "/z";
    std::snprintf(line, sizeof line, "0x%-18llx0x%-18llx%-8s%-6d", static_cast<unsigned long long>(e.start),
                  static_cast<unsigned long long>(e.length), kind.c_str(), e.depth);
    out.text() << line << file << "\n";
  }
  out.text() << "\nOffset, Length: guest bytes, in hex. Kind: data = stored, data/z = stored compressed,\n"
                "zero = reads as zeros (a zero cluster, or a hole of a raw file),\n"
                "hole = allocated in no layer (reads as zeros).\n"
                "Depth: the layer that answers, 0 = the image itself, 1 = its backing file, and so on;\n"
                "File: that layer's file.\n";
  return kExitOk;
}

// `a_snapshot`, `b_snapshot`: read that image at this internal snapshot ("" = its current state).
int RunCompare(const std::string& a_path, const std::string& b_path, const ImageFlags& a_flags,
               const ImageFlags& b_flags, const std::string& a_snapshot, const std::string& b_snapshot,
               bool strict_size, Output& out) {
  // As qemu-img compare: 0 identical, 1 different, 2 any error.
  constexpr int kExitCompareError = 2;
  auto ao = a_flags.ToOpenOptions();
  auto bo = b_flags.ToOpenOptions();
  if (!ao.ok()) return out.Fail(ao.error(), kExitCompareError);
  if (!bo.ok()) return out.Fail(bo.error(), kExitCompareError);
  ao->snapshot = a_snapshot;
  bo->snapshot = b_snapshot;
  WarnIfMisnamed(out, a_path, a_flags.format);
  WarnIfMisnamed(out, b_path, b_flags.format);
  auto a = OpenImageFile(a_path, *ao, a_flags.http);
  if (!a.ok()) return out.Fail(a.error(), kExitCompareError);
  auto b = OpenImageFile(b_path, *bo, b_flags.http);
  if (!b.ok()) return out.Fail(b.error(), kExitCompareError);
  auto c = pipeline::CompareImages(**a, **b, strict_size);
  if (!c.ok()) return out.Fail(c.error(), kExitCompareError);
  const uint64_t sa = c->a_size, sb = c->b_size;
  json j = {{"a", a_path}, {"b", b_path}, {"identical", c->identical}, {"a_virtual_size", sa},
            {"b_virtual_size", sb}};
  // qemu-img compare names the 512-byte sector that differs; the byte
  // itself comes beside it.
  if (c->first_difference) {
    j["first_difference"] = *c->first_difference / 512 * 512;
    j["first_difference_byte"] = *c->first_difference;
  }
  if (!a_snapshot.empty()) j["a_snapshot"] = a_snapshot;
  if (!b_snapshot.empty()) j["b_snapshot"] = b_snapshot;
  if (c->identical && c->sizes_differ()) {
    out.Warning("image size mismatch (" + HumanBytesExact(sa) + " vs " + HumanBytesExact(sb) +
                "); the larger one's tail reads as zeros");
  }
  out.Result(j);
  if (c->first_difference) {
    out.text() << "Content mismatch at offset " << *c->first_difference / 512 * 512
               << "! (the first differing byte is " << *c->first_difference << ")\n";
  } else if (!c->identical) {
    out.text() << "Image size mismatch: " << HumanBytesExact(sa) << " vs " << HumanBytesExact(sb) << "\n";
  } else {
    out.text() << "Images are identical.\n";
  }
  return c->identical ? kExitOk : 1;
}

int RunCheck(const std::string& path, Output& out) {
  if (IsNbdUri(path)) {
    return out.Fail(Error::NotSupported("check reads a qcow2 file's structure; an NBD export is not a file")
                        .set_path(path));
  }
  auto file = Env::Default().OpenSource(path);
  if (!file.ok()) return out.Fail(file.error());
  // Not a qcow2 at all is a wrong input (exit 1), not a damaged image (2).
  auto probed = formats::ProbeFormatName(**file);
  if (!probed.ok()) return out.Fail(Error(probed.error()).set_path(path));
  if (*probed != "qcow2") {
    return out.Fail(Error::InvalidArgument("not a qcow2 image (its first bytes " +
                                           (*probed == "raw" ? std::string("hold no image header: raw")
                                                             : "are a " + *probed + " header") +
                                           "); check inspects qcow2 structure only")
                        .set_path(path));
  }
  auto report = formats::qcow2::CheckQcow2(**file);
  if (!report.ok()) return out.Fail(Error(report.error()).set_path(path));
  const auto& r = *report;
  {
    out.Result({{"filename", path},
               {"check_errors", 0},
               {"corruptions", r.corruptions},
               {"leaks", r.leaks},
               {"allocated_clusters", r.allocated_clusters},
               {"total_clusters", r.total_clusters},
               {"file_clusters", r.file_clusters},
               {"compressed_clusters", r.compressed_clusters},
               {"fragmented_clusters", r.fragmented_clusters},
               {"image_end_offset", r.image_end_offset},
               {"messages", r.messages}});
  }
  std::ostream& t = out.text();
  for (const auto& m : r.messages) t << m << "\n";
  if (r.clean()) t << "No errors were found on the image.\n";
  if (r.corruptions) t << r.corruptions << " errors were found on the image.\n";
  if (r.leaks) t << r.leaks << " leaked clusters were found on the image.\n";
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
    t << line;
  }
  if (r.image_end_offset) t << "Image end offset: " << r.image_end_offset << "\n";
  return r.exit_code();
}

}  // namespace

void RegisterImageCommands(CLI::App& app, int& exit_code) {
  // Each command's arguments live in a shared struct owned by its callback,
  // so CLI11's pointers into it stay valid for the parse.
  struct PathArgs {
    std::string path;
    ImageFlags flags;
  };
  {
    auto args = std::make_shared<PathArgs>();
    auto* cmd = AddCommand(app, "info", "Show an image's format, size, chain, bitmaps, snapshots", exit_code,
                           [args](Output& out) { return RunInfo(args->path, args->flags, out); });
    cmd->add_option("image", args->path, "Image file, block device, nbd:// URI or http(s):// URL")->required();
    args->flags.AddTo(cmd);
    AddHttpFlags(cmd, args->flags.http);
    cmd->footer(
        "As qemu-img info, with these differences (docs/formats/qcow2.md, section 8): every layer of the\n"
        "backing chain is shown (as --backing-chain); \"disk size\" (JSON actual_size) is the space the file\n"
        "takes and \"file length\" (file_size) its apparent size; snapshot dates are RFC 3339 UTC (qemu\n"
        "prints local time); JSON names are snake_case. A backing file with no recorded format is shown\n"
        "but not opened (barge never probes a format): the output says how to record it\n"
        "(qemu-img rebase -u -F FORMAT -b NAME IMAGE).");
  }
  {
    struct MapArgs {
      std::string path, snapshot;
      ImageFlags flags;
    };
    auto args = std::make_shared<MapArgs>();
    auto* cmd = AddCommand(app, "map", "Show data/zero/hole extents and the chain layer of each", exit_code,
                           [args](Output& out) { return RunMap(args->path, args->flags, args->snapshot, out); });
    cmd->add_option("image", args->path, "Image file, block device or http(s):// URL")->required();
    args->flags.AddTo(cmd);
    AddHttpFlags(cmd, args->flags.http);
    cmd->add_option("-l,--snapshot", args->snapshot, "Map the qcow2 image at this internal snapshot (id or name)");
    cmd->footer(
        "--json gives qemu-img map --output=json's fields (start, length, depth, present, zero, data, offset)\n"
        "with the same values, plus \"compressed\" and \"file\" (the file an offset points into: an external\n"
        "data file where the image has one). The text table is barge's own (docs/formats/qcow2.md, section 8).\n"
        "A backing file with no recorded format is refused: barge never probes a format.");
  }
  {
    auto args = std::make_shared<PathArgs>();
    auto* cmd = AddCommand(app, "check", "Check a qcow2 file's structure (exit 0 clean, 2 corruption, 3 leaks only)",
                           exit_code, [args](Output& out) { return RunCheck(args->path, out); });
    cmd->add_option("image", args->path, "qcow2 file")->required();
    cmd->footer(
        "Counts as qemu-img check does (corruptions, leaks, allocated, fragmented, compressed and total\n"
        "clusters, image end offset); the differences are in docs/formats/qcow2.md, section 8.");
  }
  {
    struct CompareArgs {
      std::string a, b, a_snapshot, b_snapshot;
      ImageFlags a_flags, b_flags;
      bool strict = false;
    };
    auto args = std::make_shared<CompareArgs>();
    auto* cmd = AddCommand(app, "compare", "Compare two images' guest data (exit 0 same, 1 different, 2 error)",
                           exit_code, [args](Output& out) {
                             args->b_flags.allow_any_path = args->a_flags.allow_any_path;
                             args->b_flags.allow_dirs = args->a_flags.allow_dirs;
                             args->b_flags.http = args->a_flags.http;
                             return RunCompare(args->a, args->b, args->a_flags, args->b_flags, args->a_snapshot,
                                              args->b_snapshot, args->strict, out);
                           });
    cmd->add_option("a", args->a, "First image (file, block device, nbd:// URI or http(s):// URL)")->required();
    cmd->add_option("b", args->b, "Second image (file, block device, nbd:// URI or http(s):// URL)")->required();
    args->a_flags.AddTo(cmd, "-f,--format-a");
    AddHttpFlags(cmd, args->a_flags.http);  // for both images
    cmd->add_option("-F,--format-b", args->b_flags.format, "Format of the second image")
        ->check(CLI::IsMember({"raw", "qcow2"}));
    cmd->add_flag("-s,--strict", args->strict, "Images of different sizes differ");
    cmd->add_option("-l,--snapshot", args->a_snapshot, "Read the first (qcow2) image at this internal snapshot");
    cmd->add_option("--snapshot-b", args->b_snapshot, "Read the second (qcow2) image at this internal snapshot");
    cmd->footer(
        "As qemu-img compare: \"Content mismatch at offset N!\" names the start of the first differing\n"
        "512-byte sector; barge adds the first differing byte (JSON first_difference_byte). A backing file\n"
        "with no recorded format is refused: barge never probes a format (docs/formats/qcow2.md, section 8).");
  }
}

}  // namespace barge::cli
