// barge bitmap list|dump and barge overlay create: persistent dirty bitmaps
// and the metadata-only CBT overlay over a raw disk.
#include <cstdio>

#include "blockio/env.h"
#include "cli/common.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_writer.h"
#include "pipeline/cbt_overlay.h"

namespace barge::cli {
namespace {

using nlohmann::json;

int RunBitmapList(const std::string& path, const ImageFlags& flags, Output& out) {
  auto options = flags.ToOpenOptions();
  if (!options.ok()) return out.Usage(options.error().message());
  options->open_data_file = false;
  options->open_backing = false;
  auto image = OpenImageFile(path, *options);
  if (!image.ok()) return out.Fail(image.error());
  const auto& bitmaps = (*image)->info().bitmaps;
  json arr = json::array();
  for (const auto& b : bitmaps) {
    arr.push_back({{"name", b.name}, {"granularity", b.granularity_bytes}, {"enabled", b.enabled}, {"in_use", b.in_use}});
  }
  out.Result({{"image", path}, {"bitmaps", arr}});
  if (bitmaps.empty()) out.text() << "no bitmaps\n";
  for (const auto& b : bitmaps) {
    out.text() << b.name << "  granularity " << HumanBytes(b.granularity_bytes) << "  "
              << (b.enabled ? "enabled" : "disabled")
              << (b.in_use ? "  IN USE (inconsistent: take a full backup)" : "") << "\n";
  }
  return kExitOk;
}

int RunBitmapDump(const std::string& path, const std::string& name, const ImageFlags& flags,
                  Output& out) {
  auto options = flags.ToOpenOptions();
  if (!options.ok()) return out.Usage(options.error().message());
  options->open_data_file = false;
  options->open_backing = false;
  auto image = OpenImageFile(path, *options);
  if (!image.ok()) return out.Fail(image.error());
  auto ranges = formats::ReadBitmapDirtyRanges(**image, name);
  if (!ranges.ok()) return out.Fail(ranges.error());
  const formats::BitmapInfo* info = nullptr;
  for (const auto& b : (*image)->info().bitmaps) {
    if (b.name == name) info = &b;
  }
  uint64_t total = TotalBytes(*ranges);
  {
    json arr = json::array();
    for (const Range& r : *ranges) arr.push_back({{"offset", r.offset}, {"length", r.length}});
    out.Result({{"image", path},
               {"bitmap", name},
               {"granularity", info ? info->granularity_bytes : 0},
               {"enabled", info && info->enabled},
               {"in_use", info && info->in_use},
               {"dirty_bytes", total},
               {"dirty", arr}});
  }
  for (const Range& r : *ranges) {
    char line[64];
    std::snprintf(line, sizeof line, "%20llu %20llu dirty\n", static_cast<unsigned long long>(r.offset),
                  static_cast<unsigned long long>(r.length));
    out.text() << line;
  }
  out.text() << "total dirty: " << HumanBytesExact(total) << " in " << ranges->size() << " ranges\n";
  return kExitOk;
}

int RunOverlayCreate(const std::string& data_file, const std::string& overlay,
                     const std::vector<std::string>& bitmap_names, uint64_t granularity,
                     uint32_t cluster_bits, Output& out) {
  pipeline::CbtOverlayRequest req;
  req.data_file = data_file;
  req.overlay = overlay;
  req.cluster_bits = cluster_bits;
  for (const auto& n : bitmap_names) {
    formats::BitmapSpec b;
    b.name = n;
    b.granularity_bytes = static_cast<uint32_t>(granularity);
    b.enabled = true;
    req.bitmaps.push_back(b);
  }
  auto made = pipeline::CreateCbtOverlay(Env::Default(), req);
  if (!made.ok()) return out.Fail(made.error());
  if (!made->warning.empty()) out.Warning(made->warning, data_file);
  const uint64_t size = made->virtual_size;
  const std::string& abs = made->data_file;
  out.Result({{"overlay", overlay}, {"data_file", abs}, {"virtual_size", size}, {"bitmaps", bitmap_names}});
  out.text() << "created " << overlay << ": " << HumanBytes(size) << " over " << abs;
  if (!bitmap_names.empty()) out.text() << ", bitmaps:";
  for (const auto& n : bitmap_names) out.text() << " " << n;
  out.text() << "\n";
  return kExitOk;
}

}  // namespace

void RegisterBitmapCommands(CLI::App& app, int& exit_code) {
  auto* bitmap = AddGroup(app, "bitmap", "Persistent dirty bitmaps of a qcow2 image");
  {
    struct Args {
      std::string path;
      ImageFlags flags;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = AddCommand(*bitmap, "list", "List bitmaps with granularity and flags", exit_code,
                           [args](Output& out) { return RunBitmapList(args->path, args->flags, out); });
    cmd->add_option("image", args->path, "qcow2 image")->required();
    args->flags.AddTo(cmd);
  }
  {
    struct Args {
      std::string path, name;
      ImageFlags flags;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = AddCommand(*bitmap, "dump", "Print the dirty ranges of one bitmap", exit_code,
                           [args](Output& out) { return RunBitmapDump(args->path, args->name, args->flags, out); });
    cmd->add_option("image", args->path, "qcow2 image")->required();
    cmd->add_option("name", args->name, "Bitmap name")->required();
    args->flags.AddTo(cmd);
  }
  auto* overlay = AddGroup(app, "overlay", "CBT overlays over raw disks");
  {
    struct Args {
      std::string data_file, overlay, granularity = "64K";
      std::vector<std::string> bitmaps;
      uint32_t cluster_bits = 16;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = AddCommand(
        *overlay, "create", "Create a metadata-only qcow2 overlay over a raw disk (the raw bytes are never written)",
        exit_code, [args](Output& out) {
          auto g = ParseSize(args->granularity);
          if (!g.ok()) return out.Usage("--granularity: " + g.error().message());
          if (*g < 512 || *g > (uint64_t{1} << 31) || (*g & (*g - 1)) != 0) {
            return out.Usage("--granularity must be a power of two from 512 to 2G, not " + args->granularity);
          }
          return RunOverlayCreate(args->data_file, args->overlay, args->bitmaps, *g, args->cluster_bits, out);
        });
    cmd->add_option("--data-file", args->data_file, "The raw disk")->required();
    cmd->add_option("overlay", args->overlay, "The qcow2 overlay to create")->required();
    cmd->add_option("--bitmap", args->bitmaps, "Add an enabled persistent bitmap (repeatable)");
    cmd->add_option("--granularity", args->granularity, "Bitmap granularity")->capture_default_str();
    cmd->add_option("--cluster-bits", args->cluster_bits, "Overlay cluster size as a power of two")
        ->capture_default_str()
        ->check(CLI::Range(9, 21));
  }
}

}  // namespace barge::cli
