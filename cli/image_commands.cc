// barge info / map / compare: look at images the way qemu-img does.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <vector>

#include "blockio/buffer.h"
#include "blockio/file.h"
#include "cli/common.h"
#include "formats/qcow2_check.h"

namespace barge::cli {
namespace {

using nlohmann::json;

std::vector<const formats::Image*> Chain(const formats::Image& top) {
  std::vector<const formats::Image*> chain;
  for (const formats::Image* i = &top; i != nullptr; i = i->backing()) chain.push_back(i);
  return chain;
}

json BitmapJson(const formats::BitmapInfo& b) {
  json flags = json::array();
  if (b.in_use) flags.push_back("in-use");
  if (b.enabled) flags.push_back("auto");
  return {{"name", b.name}, {"granularity", b.granularity_bytes}, {"flags", flags}};
}

json LayerJson(const formats::ImageInfo& info) {
  json j = {{"filename", info.path},
            {"format", formats::ImageFormatName(info.format)},
            {"virtual_size", info.virtual_size},
            {"file_size", info.file_size}};
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
    j["snapshots"].push_back({{"id", s.id},
                              {"name", s.name},
                              {"virtual_size", s.virtual_size},
                              {"vm_state_size", s.vm_state_size},
                              {"date_sec", s.date_sec},
                              {"date_nsec", s.date_nsec},
                              {"vm_clock_nsec", s.vm_clock_nsec}});
  }
  return j;
}

void PrintLayerText(const formats::ImageInfo& info) {
  std::cout << "image: " << info.path << "\n"
            << "file format: " << formats::ImageFormatName(info.format) << "\n"
            << "virtual size: " << HumanBytes(info.virtual_size) << " (" << info.virtual_size
            << " bytes)\n"
            << "file size: " << HumanBytes(info.file_size) << "\n";
  if (info.format != formats::ImageFormat::kQcow2) return;
  std::cout << "cluster_size: " << info.cluster_size() << "\n"
            << "version: " << info.version << (info.version >= 3 ? " (compat 1.1)" : " (compat 0.10)")
            << "\n"
            << "compression type: "
            << (info.compression == formats::Compression::kZstd ? "zstd" : "zlib") << "\n"
            << "refcount bits: " << info.refcount_bits << "\n";
  if (info.extended_l2) std::cout << "extended l2: true\n";
  if (info.dirty) std::cout << "dirty flag: true\n";
  if (info.corrupt) std::cout << "corrupt: true\n";
  if (!info.backing_file.empty()) {
    std::cout << "backing file: " << info.backing_file;
    if (!info.backing_path.empty()) std::cout << " (actual path: " << info.backing_path << ")";
    std::cout << "\nbacking file format: "
              << (info.backing_format.empty() ? "(none)" : info.backing_format) << "\n";
  }
  if (!info.data_file.empty()) {
    std::cout << "data file: " << info.data_file << "\n"
              << "data file raw: " << (info.data_file_raw ? "true" : "false") << "\n";
  }
  if (!info.bitmaps.empty()) {
    std::cout << "bitmaps:\n";
    for (const auto& b : info.bitmaps) {
      std::cout << "  " << b.name << ": granularity " << b.granularity_bytes
                << ", enabled " << (b.enabled ? "yes" : "no")
                << (b.in_use ? ", IN USE (inconsistent)" : "") << "\n";
    }
  }
  if (!info.snapshots.empty()) {
    std::cout << "snapshots:\n";
    for (const auto& s : info.snapshots) {
      std::cout << "  " << s.id << "  " << s.name << "  vm state " << HumanBytes(s.vm_state_size)
                << "  date " << s.date_sec << "\n";
    }
  }
}

int RunInfo(const std::string& path, const ImageFlags& flags, bool as_json) {
  auto options = flags.ToOpenOptions();
  if (!options.ok()) return ReportError(options.error());
  options->open_data_file = false;  // info never needs the data file's bytes
  auto image = OpenImageFile(path, *options);
  if (!image.ok()) return ReportError(image.error());
  auto chain = Chain(**image);
  if (as_json) {
    json j = LayerJson((*image)->info());
    j["chain"] = json::array();
    for (const auto* layer : chain) j["chain"].push_back(LayerJson(layer->info()));
    PrintJson(j);
    return kExitOk;
  }
  for (size_t i = 0; i < chain.size(); ++i) {
    if (i > 0) std::cout << "\n";
    PrintLayerText(chain[i]->info());
  }
  return kExitOk;
}

int RunMap(const std::string& path, const ImageFlags& flags, bool as_json) {
  auto options = flags.ToOpenOptions();
  if (!options.ok()) return ReportError(options.error());
  auto image = OpenImageFile(path, *options);
  if (!image.ok()) return ReportError(image.error());
  auto chain = Chain(**image);
  int bottom = static_cast<int>(chain.size()) - 1;
  uint64_t size = (*image)->size_bytes();
  // Windows of 1 GiB, or 1/4096 of the disk when larger: a hostile image
  // may claim 2 EiB (2^31 windows of 1 GiB took hours); Map's own cost is
  // per L1 entry and per allocated cluster, not per byte.
  const uint64_t kWindow = std::max<uint64_t>(1ull << 30, ((size >> 12) + (1ull << 30) - 1) & ~((1ull << 30) - 1));
  std::vector<formats::MappedExtent> all;
  for (uint64_t off = 0; off < size; off += kWindow) {
    auto part = (*image)->Map(off, std::min(kWindow, size - off));
    if (!part.ok()) return ReportError(part.error());
    for (auto& e : *part) {
      // Merge neighbours that look the same, as qemu-img map does.
      if (!all.empty()) {
        auto& last = all.back();
        bool contiguous_host = (!last.host_offset && !e.host_offset) ||
                               (last.host_offset && e.host_offset &&
                                *last.host_offset + last.length == *e.host_offset);
        if (last.kind == e.kind && last.depth == e.depth && last.compressed == e.compressed &&
            contiguous_host && last.offset + last.length == e.offset) {
          last.length += e.length;
          continue;
        }
      }
      all.push_back(e);
    }
  }
  if (as_json) {
    json arr = json::array();
    for (const auto& e : all) {
      json j = {{"start", e.offset},
                {"length", e.length},
                {"depth", e.depth < 0 ? bottom : e.depth},
                {"present", e.kind != ExtentKind::kHole},
                {"zero", e.kind != ExtentKind::kData},
                {"data", e.kind == ExtentKind::kData},
                {"compressed", e.compressed}};
      if (e.host_offset) j["offset"] = *e.host_offset;
      if (e.depth >= 0 && e.depth <= bottom) j["file"] = chain[e.depth]->info().path;
      arr.push_back(j);
    }
    PrintJson(arr);
    return kExitOk;
  }
  std::printf("%-20s%-20s%-8s%-6s%s\n", "Offset", "Length", "Kind", "Depth", "File");
  for (const auto& e : all) {
    std::string file = e.depth >= 0 && e.depth <= bottom ? chain[e.depth]->info().path : "-";
    std::string kind(ExtentKindName(e.kind));
    if (e.compressed) kind += "/z";
    std::printf("0x%-18llx0x%-18llx%-8s%-6d%s\n", static_cast<unsigned long long>(e.offset),
                static_cast<unsigned long long>(e.length), kind.c_str(),
                e.depth < 0 ? bottom : e.depth, file.c_str());
  }
  return kExitOk;
}

bool AllZeroKinds(const ExtentList& extents) {
  return std::all_of(extents.begin(), extents.end(),
                     [](const Extent& e) { return e.kind != ExtentKind::kData; });
}

// Compares [offset, offset+length) of a and b; returns the first differing
// offset or nullopt.
Result<std::optional<uint64_t>> CompareRange(formats::Image& a, formats::Image& b,
                                             uint64_t offset, uint64_t length) {
  constexpr uint64_t kChunk = 4 << 20;
  AlignedBuffer ba(kChunk), bb(kChunk);
  for (uint64_t off = offset; off < offset + length; off += kChunk) {
    uint64_t n = std::min(kChunk, offset + length - off);
    BARGE_ASSIGN_OR_RETURN(ExtentList ea, a.Extents(off, n));
    BARGE_ASSIGN_OR_RETURN(ExtentList eb, b.Extents(off, n));
    if (AllZeroKinds(ea) && AllZeroKinds(eb)) continue;
    ba.resize(n);
    bb.resize(n);
    BARGE_RETURN_IF_ERROR(a.ReadAt(off, ba.span()));
    BARGE_RETURN_IF_ERROR(b.ReadAt(off, bb.span()));
    if (std::memcmp(ba.data(), bb.data(), n) != 0) {
      for (uint64_t i = 0; i < n; ++i) {
        if (ba.data()[i] != bb.data()[i]) return std::optional<uint64_t>(off + i);
      }
    }
  }
  return std::optional<uint64_t>();
}

// The first non-zero byte of [offset, end) of an image, if any.
Result<std::optional<uint64_t>> FirstNonZero(formats::Image& img, uint64_t offset, uint64_t end) {
  constexpr uint64_t kChunk = 4 << 20;
  AlignedBuffer buf(kChunk);
  for (uint64_t off = offset; off < end; off += kChunk) {
    uint64_t n = std::min(kChunk, end - off);
    BARGE_ASSIGN_OR_RETURN(ExtentList e, img.Extents(off, n));
    if (AllZeroKinds(e)) continue;
    buf.resize(n);
    BARGE_RETURN_IF_ERROR(img.ReadAt(off, buf.span()));
    for (uint64_t i = 0; i < n; ++i) {
      if (buf.data()[i] != std::byte{0}) return std::optional<uint64_t>(off + i);
    }
  }
  return std::optional<uint64_t>();
}

int RunCompare(const std::string& a_path, const std::string& b_path, const ImageFlags& a_flags,
               const ImageFlags& b_flags, bool strict_size) {
  constexpr int kExitCompareError = 2;
  auto ao = a_flags.ToOpenOptions();
  auto bo = b_flags.ToOpenOptions();
  if (!ao.ok()) return ReportError(ao.error(), kExitCompareError);
  if (!bo.ok()) return ReportError(bo.error(), kExitCompareError);
  auto a = OpenImageFile(a_path, *ao);
  if (!a.ok()) return ReportError(a.error(), kExitCompareError);
  auto b = OpenImageFile(b_path, *bo);
  if (!b.ok()) return ReportError(b.error(), kExitCompareError);
  uint64_t sa = (*a)->size_bytes(), sb = (*b)->size_bytes();
  if (strict_size && sa != sb) {
    std::cout << "Image size mismatch: " << sa << " vs " << sb << "\n";
    return 1;
  }
  auto diff = CompareRange(**a, **b, 0, std::min(sa, sb));
  if (!diff.ok()) return ReportError(diff.error(), kExitCompareError);
  if (!*diff && sa != sb) {
    // The larger image's tail must read as zeros, as qemu-img compare says.
    auto& bigger = sa > sb ? *a : *b;
    diff = FirstNonZero(*bigger, std::min(sa, sb), std::max(sa, sb));
    if (!diff.ok()) return ReportError(diff.error(), kExitCompareError);
    if (!*diff) std::cerr << "Warning: image size mismatch!\n";
  }
  if (*diff) {
    std::cout << "Content mismatch at offset " << **diff << "!\n";
    return 1;
  }
  std::cout << "Images are identical.\n";
  return kExitOk;
}

int RunCheck(const std::string& path, bool as_json) {
  auto file = OpenFileSource(path);
  if (!file.ok()) return ReportError(file.error());
  auto report = formats::qcow2::CheckQcow2(**file);
  if (!report.ok()) {
    // A header we cannot parse is corruption for the caller, as qemu-img says.
    int code = report.error().code() == ErrorCode::kCorruption ? 2 : kExitError;
    return ReportError(report.error(), code);
  }
  const auto& r = *report;
  if (as_json) {
    PrintJson({{"filename", path},
               {"check_errors", 0},
               {"corruptions", r.corruptions},
               {"leaks", r.leaks},
               {"allocated_clusters", r.allocated_clusters},
               {"total_clusters", r.total_clusters},
               {"file_clusters", r.file_clusters},
               {"messages", r.messages}});
    return r.exit_code();
  }
  for (const auto& m : r.messages) std::cout << m << "\n";
  if (r.clean()) std::cout << "No errors were found on the image.\n";
  if (r.corruptions) std::cout << r.corruptions << " errors were found on the image.\n";
  if (r.leaks) std::cout << r.leaks << " leaked clusters were found on the image.\n";
  if (r.total_clusters) {
    std::printf("%llu/%llu = %.2f%% allocated\n", static_cast<unsigned long long>(r.allocated_clusters),
                static_cast<unsigned long long>(r.total_clusters),
                100.0 * static_cast<double>(r.allocated_clusters) / static_cast<double>(r.total_clusters));
  }
  return r.exit_code();
}

}  // namespace

void RegisterImageCommands(CLI::App& app, int& exit_code) {
  // Each command's arguments live in a shared struct owned by its callback,
  // so CLI11's pointers into it stay valid for the parse.
  struct PathArgs {
    std::string path;
    ImageFlags flags;
    bool as_json = false;
  };
  {
    auto* cmd = app.add_subcommand("info", "Show an image's format, size, chain, bitmaps, snapshots");
    auto args = std::make_shared<PathArgs>();
    cmd->add_option("image", args->path, "Image file or block device")->required();
    args->flags.AddTo(cmd);
    cmd->add_flag("--json", args->as_json, "Print JSON");
    cmd->callback([args, &exit_code]() { exit_code = RunInfo(args->path, args->flags, args->as_json); });
  }
  {
    auto* cmd = app.add_subcommand("map", "Show data/zero/hole extents and the chain layer of each");
    auto args = std::make_shared<PathArgs>();
    cmd->add_option("image", args->path, "Image file or block device")->required();
    args->flags.AddTo(cmd);
    cmd->add_flag("--json", args->as_json, "Print JSON (fields as qemu-img map, plus compressed)");
    cmd->callback([args, &exit_code]() { exit_code = RunMap(args->path, args->flags, args->as_json); });
  }
  {
    auto* cmd = app.add_subcommand(
        "check", "Check a qcow2 file's structure (exit 0 clean, 2 corruption, 3 leaks only)");
    auto args = std::make_shared<PathArgs>();
    cmd->add_option("image", args->path, "qcow2 file")->required();
    cmd->add_flag("--json", args->as_json, "Print JSON");
    cmd->callback([args, &exit_code]() { exit_code = RunCheck(args->path, args->as_json); });
  }
  {
    auto* cmd = app.add_subcommand(
        "compare", "Compare two images' guest data (exit 0 same, 1 different, 2 error)");
    struct CompareArgs {
      std::string a, b;
      ImageFlags a_flags, b_flags;
      bool strict = false;
    };
    auto args = std::make_shared<CompareArgs>();
    cmd->add_option("a", args->a, "First image")->required();
    cmd->add_option("b", args->b, "Second image")->required();
    args->a_flags.AddTo(cmd, "-f,--format-a");
    cmd->add_option("-F,--format-b", args->b_flags.format, "Format of the second image")
        ->check(CLI::IsMember({"raw", "qcow2"}));
    cmd->add_flag("-s,--strict", args->strict, "Images of different sizes differ");
    cmd->callback([args, &exit_code]() {
      args->b_flags.allow_any_path = args->a_flags.allow_any_path;
      args->b_flags.allow_dirs = args->a_flags.allow_dirs;
      exit_code = RunCompare(args->a, args->b, args->a_flags, args->b_flags, args->strict);
    });
  }
}

}  // namespace barge::cli
