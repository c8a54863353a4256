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
#include "pipeline/image_report.h"

namespace barge::cli {
namespace {

using nlohmann::json;

// As `bitmap list`: qemu-img's "flags" (in-use, auto) as booleans.
json BitmapJson(const formats::BitmapInfo& b) {
  return {{"name", b.name}, {"granularity", b.granularity_bytes}, {"enabled", b.enabled}, {"in_use", b.in_use}};
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
  if (!last.backing_file.empty() && last.backing_format.empty()) {
    out.Warning(pipeline::MissingBackingFormatFix(last), last.path);
  }
  // One stat per layer; the top layer is chain[0].
  std::vector<std::optional<uint64_t>> actual;
  for (const auto* layer : chain) actual.push_back(pipeline::ActualSize(Env::Default(), layer->info()));
  json j = LayerJson((*image)->info(), actual[0]);
  j["chain"] = json::array();
  for (size_t i = 0; i < chain.size(); ++i) j["chain"].push_back(LayerJson(chain[i]->info(), actual[i]));
  out.Result(j);
  for (size_t i = 0; i < chain.size(); ++i) {
    if (i > 0) out.text() << "\n";
    out.text() << pipeline::ImageInfoText(chain[i]->info(), actual[i]);
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
  std::vector<std::string> layer_paths;
  for (const auto* layer : chain) layer_paths.push_back(layer->info().path);
  out.text() << pipeline::MapText(*all, layer_paths);
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
  auto report = pipeline::CheckQcow2File(Env::Default(), path);
  if (!report.ok()) return out.Fail(report.error());
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
  out.text() << pipeline::CheckReportText(r);
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
