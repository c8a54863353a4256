// barge bitmap list|dump and barge overlay create: persistent dirty bitmaps
// and the metadata-only CBT overlay over a raw disk.
#include <sys/stat.h>

#include <filesystem>
#include <iostream>

#include "cli/common.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_writer.h"
#include "pipeline/staged_file.h"

namespace barge::cli {
namespace {

using nlohmann::json;

int RunBitmapList(const std::string& path, const ImageFlags& flags, bool as_json) {
  auto options = flags.ToOpenOptions();
  if (!options.ok()) return ReportError(options.error());
  options->open_data_file = false;
  options->open_backing = false;
  auto image = OpenImageFile(path, *options);
  if (!image.ok()) return ReportError(image.error());
  const auto& bitmaps = (*image)->info().bitmaps;
  if (as_json) {
    json arr = json::array();
    for (const auto& b : bitmaps) {
      arr.push_back({{"name", b.name},
                     {"granularity", b.granularity_bytes},
                     {"enabled", b.enabled},
                     {"in_use", b.in_use}});
    }
    PrintJson(arr);
    return kExitOk;
  }
  if (bitmaps.empty()) std::cout << "no bitmaps\n";
  for (const auto& b : bitmaps) {
    std::cout << b.name << "  granularity " << b.granularity_bytes << "  "
              << (b.enabled ? "enabled" : "disabled")
              << (b.in_use ? "  IN USE (inconsistent: take a full backup)" : "") << "\n";
  }
  return kExitOk;
}

int RunBitmapDump(const std::string& path, const std::string& name, const ImageFlags& flags,
                  bool as_json) {
  auto options = flags.ToOpenOptions();
  if (!options.ok()) return ReportError(options.error());
  options->open_data_file = false;
  options->open_backing = false;
  auto image = OpenImageFile(path, *options);
  if (!image.ok()) return ReportError(image.error());
  auto ranges = formats::ReadBitmapDirtyRanges(**image, name);
  if (!ranges.ok()) return ReportError(ranges.error());
  const formats::BitmapInfo* info = nullptr;
  for (const auto& b : (*image)->info().bitmaps) {
    if (b.name == name) info = &b;
  }
  uint64_t total = TotalBytes(*ranges);
  if (as_json) {
    json arr = json::array();
    for (const Range& r : *ranges) arr.push_back({{"offset", r.offset}, {"length", r.length}});
    PrintJson({{"bitmap", name},
               {"granularity", info ? info->granularity_bytes : 0},
               {"enabled", info && info->enabled},
               {"in_use", info && info->in_use},
               {"dirty_bytes", total},
               {"dirty", arr}});
    return kExitOk;
  }
  for (const Range& r : *ranges) {
    std::printf("%20llu %20llu dirty\n", static_cast<unsigned long long>(r.offset),
                static_cast<unsigned long long>(r.length));
  }
  std::cout << "total dirty: " << HumanBytes(total) << " (" << total << " bytes) in "
            << ranges->size() << " ranges\n";
  return kExitOk;
}

int RunOverlayCreate(const std::string& data_file, const std::string& overlay,
                     const std::vector<std::string>& bitmap_names, uint64_t granularity,
                     uint32_t cluster_bits) {
  std::error_code ec;
  std::string abs = std::filesystem::canonical(data_file, ec).string();
  if (ec) return ReportError(Error::FromErrno(ec.value(), "resolve data file", data_file));
  struct stat st;
  if (::stat(abs.c_str(), &st) != 0) return ReportError(Error::FromErrno(errno, "stat", abs));
  uint64_t size = 0;
  if (S_ISREG(st.st_mode)) {
    size = static_cast<uint64_t>(st.st_size);
  } else {
    return ReportError(Error::InvalidArgument("data file must be a regular raw file").set_path(abs));
  }
  // qemu sees floor(size/512)*512 bytes; never claim more than the file has.
  size &= ~uint64_t{511};
  if (size == 0) return ReportError(Error::InvalidArgument("data file is empty").set_path(abs));
  formats::OverlayOptions o;
  o.virtual_size = size;
  o.data_file_path = abs;
  o.cluster_bits = cluster_bits;
  for (const auto& n : bitmap_names) {
    formats::BitmapSpec b;
    b.name = n;
    b.granularity_bytes = static_cast<uint32_t>(granularity);
    b.enabled = true;
    o.bitmaps.push_back(b);
  }
  auto staged = pipeline::StagedFile::Create(overlay);
  if (!staged.ok()) return ReportError(staged.error());
  Status s = formats::WriteDataFileOverlay((*staged)->sink(), o);
  if (s.ok()) s = (*staged)->Commit();
  if (!s.ok()) return ReportError("overlay create", s.error());
  std::cout << "created " << overlay << ": " << HumanBytes(size) << " over " << abs;
  if (!bitmap_names.empty()) std::cout << ", bitmaps:";
  for (const auto& n : bitmap_names) std::cout << " " << n;
  std::cout << "\n";
  return kExitOk;
}

}  // namespace

void RegisterBitmapCommands(CLI::App& app, int& exit_code) {
  auto* bitmap = app.add_subcommand("bitmap", "Persistent dirty bitmaps of a qcow2 image");
  bitmap->require_subcommand(1);
  {
    struct Args {
      std::string path;
      ImageFlags flags;
      bool as_json = false;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = bitmap->add_subcommand("list", "List bitmaps with granularity and flags");
    cmd->add_option("image", args->path, "qcow2 image")->required();
    args->flags.AddTo(cmd);
    cmd->add_flag("--json", args->as_json, "Print JSON");
    cmd->callback([args, &exit_code]() {
      exit_code = RunBitmapList(args->path, args->flags, args->as_json);
    });
  }
  {
    struct Args {
      std::string path, name;
      ImageFlags flags;
      bool as_json = false;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = bitmap->add_subcommand("dump", "Print the dirty ranges of one bitmap");
    cmd->add_option("image", args->path, "qcow2 image")->required();
    cmd->add_option("name", args->name, "Bitmap name")->required();
    args->flags.AddTo(cmd);
    cmd->add_flag("--json", args->as_json, "Print JSON");
    cmd->callback([args, &exit_code]() {
      exit_code = RunBitmapDump(args->path, args->name, args->flags, args->as_json);
    });
  }
  auto* overlay = app.add_subcommand("overlay", "CBT overlays over raw disks");
  overlay->require_subcommand(1);
  {
    struct Args {
      std::string data_file, overlay, granularity = "64K";
      std::vector<std::string> bitmaps;
      uint32_t cluster_bits = 16;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = overlay->add_subcommand(
        "create", "Create a metadata-only qcow2 overlay over a raw disk (the raw bytes are never written)");
    cmd->add_option("--data-file", args->data_file, "The raw disk")->required();
    cmd->add_option("overlay", args->overlay, "The qcow2 overlay to create")->required();
    cmd->add_option("--bitmap", args->bitmaps, "Add an enabled persistent bitmap (repeatable)");
    cmd->add_option("--granularity", args->granularity, "Bitmap granularity")->capture_default_str();
    cmd->add_option("--cluster-bits", args->cluster_bits, "Overlay cluster size as a power of two")
        ->capture_default_str()
        ->check(CLI::Range(9, 21));
    cmd->callback([args, &exit_code]() {
      auto g = ParseSize(args->granularity);
      if (!g.ok()) {
        exit_code = ReportError(g.error());
        return;
      }
      exit_code = RunOverlayCreate(args->data_file, args->overlay, args->bitmaps, *g,
                                   args->cluster_bits);
    });
  }
}

}  // namespace barge::cli
