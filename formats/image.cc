// Format names, raw images, and format detection for OpenImage.
#include "formats/image.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <span>

#include "formats/qcow2_open.h"
#include "formats/sector.h"

namespace barge::formats {

std::string_view ImageFormatName(ImageFormat format) {
  return format == ImageFormat::kQcow2 ? "qcow2" : "raw";
}

Result<ImageFormat> ParseImageFormat(std::string_view name) {
  if (name == "raw") return ImageFormat::kRaw;
  if (name == "qcow2") return ImageFormat::kQcow2;
  return Error::InvalidArgument("unknown image format '" + std::string(name) +
                                "' (expected raw or qcow2)");
}

std::string_view CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kZstd: return "zstd";
    case Compression::kDeflate: return "zlib";
  }
  return "unknown";
}

int MaxCompressionLevel(Compression c) {
  switch (c) {
    case Compression::kNone: return 0;
    case Compression::kZstd: return kMaxZstdLevel;
    case Compression::kDeflate: return kMaxDeflateLevel;
  }
  return 0;
}

int DefaultCompressionLevel(Compression c) {
  switch (c) {
    case Compression::kNone: return 0;
    case Compression::kZstd: return kDefaultZstdLevel;
    case Compression::kDeflate: return kDefaultDeflateLevel;
  }
  return 0;
}

std::string CompressionSpec::ToString() const {
  if (type == Compression::kNone) return "none";
  return std::string(CompressionName(type)) + ":" + std::to_string(level);
}

Result<CompressionSpec> ParseCompressionSpec(std::string_view text) {
  const auto colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  CompressionSpec spec;
  if (name == "none") {
    if (colon != std::string_view::npos) return Error::InvalidArgument("'none' takes no level");
    return CompressionSpec::None();
  } else if (name == "zstd") {
    spec.type = Compression::kZstd;
  } else if (name == "zlib" || name == "deflate") {
    spec.type = Compression::kDeflate;
  } else {
    return Error::InvalidArgument("unknown compression '" + std::string(text) +
                                  "' (use zstd[:1-19], zlib[:1-9] (or deflate) or none)");
  }
  spec.level = DefaultCompressionLevel(spec.type);
  if (colon == std::string_view::npos) return spec;
  const std::string_view level_text = text.substr(colon + 1);
  const int max_level = MaxCompressionLevel(spec.type);
  // Digits only (from_chars alone would take a leading '-'); the length cap
  // keeps the value in range of int.
  const bool digits = !level_text.empty() && level_text.size() <= 9 &&
                      std::all_of(level_text.begin(), level_text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  int level = 0;
  if (digits) std::from_chars(level_text.data(), level_text.data() + level_text.size(), level);
  if (level < 1 || level > max_level) {
    return Error::InvalidArgument("compression level must be 1.." + std::to_string(max_level) + " in '" +
                                  std::string(text) + "'");
  }
  spec.level = level;
  return spec;
}

namespace {

// A raw file: guest view == file bytes; extents from the file's allocation.
// A size that is not a multiple of 512 is rounded up, the tail reading as
// zeros, as QEMU does (qemu-img info shows a 24-byte file as a 512 B disk):
// a disk is whole sectors, and barge's copies then equal qemu-img's.
class RawImage final : public Image {
 public:
  RawImage(std::unique_ptr<BlockSource> file, const std::string& path)
      : file_(std::move(file)), file_bytes_(file_->size_bytes()) {
    info_.path = path;
    info_.format = ImageFormat::kRaw;
    info_.virtual_size = RoundUpToSector(file_bytes_);
    info_.file_size = file_bytes_;
  }
  const std::string& name() const override { return file_->name(); }
  uint64_t size_bytes() const override { return info_.virtual_size; }
  SourceCapabilities capabilities() const override { return file_->capabilities(); }
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    if (offset + out.size() <= file_bytes_) return file_->ReadAt(offset, out);
    BARGE_RETURN_IF_ERROR(CheckRange(offset, out.size()));
    const uint64_t in_file = offset < file_bytes_ ? file_bytes_ - offset : 0;
    if (in_file > 0) BARGE_RETURN_IF_ERROR(file_->ReadAt(offset, out.first(in_file)));
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(in_file), out.end(), std::byte{0});
    return OkStatus();
  }
  Status ReadMany(std::span<ReadRequest> requests) override {
    // Only a request that reaches the padded tail goes one at a time.
    const bool tail = std::any_of(requests.begin(), requests.end(),
                                  [&](const ReadRequest& r) { return r.offset + r.buffer.size() > file_bytes_; });
    return tail ? Image::ReadMany(requests) : file_->ReadMany(requests);
  }
  void WillNeed(uint64_t offset, uint64_t length) override {
    if (offset < file_bytes_) file_->WillNeed(offset, std::min(length, file_bytes_ - offset));
  }
  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override {
    if (offset + length <= file_bytes_) return file_->Extents(offset, length);
    BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
    ExtentList out;
    if (offset < file_bytes_) {
      BARGE_ASSIGN_OR_RETURN(out, file_->Extents(offset, file_bytes_ - offset));
    }
    const uint64_t tail = std::max(offset, file_bytes_);
    if (offset + length > tail) out.push_back({tail, offset + length - tail, ExtentKind::kZero});
    return out;
  }
  const ImageInfo& info() const override { return info_; }
  const Image* backing() const override { return nullptr; }
  Result<std::vector<MappedExtent>> Map(uint64_t offset, uint64_t length) override {
    BARGE_ASSIGN_OR_RETURN(ExtentList extents, Extents(offset, length));
    std::vector<MappedExtent> out;
    for (const Extent& e : extents) {
      MappedExtent m;
      m.offset = e.offset;
      m.length = e.length;
      m.kind = e.kind;
      if (e.kind != ExtentKind::kHole) {
        m.depth = 0;
        if (e.kind == ExtentKind::kData) m.host_offset = e.offset;
      }
      out.push_back(m);
    }
    return out;
  }

 private:
  std::unique_ptr<BlockSource> file_;
  uint64_t file_bytes_;  // the file's own size; size_bytes() rounds it up
  ImageInfo info_;
};

}  // namespace

std::unique_ptr<Image> WrapRaw(std::unique_ptr<BlockSource> file, const std::string& path) {
  return std::make_unique<RawImage>(std::move(file), path);
}

Result<std::unique_ptr<Image>> OpenImage(const std::string& path, const SourceOpener& opener,
                                         const OpenOptions& options) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, opener(path));
  ImageFormat format;
  if (options.format) {
    format = *options.format;
  } else {
    format = ImageFormat::kRaw;
    if (file->size_bytes() >= 4) {
      std::array<std::byte, 4> magic;
      BARGE_RETURN_IF_ERROR(file->ReadAt(0, magic));
      if (magic == std::array<std::byte, 4>{std::byte{'Q'}, std::byte{'F'}, std::byte{'I'},
                                            std::byte{0xfb}}) {
        format = ImageFormat::kQcow2;
      }
    }
  }
  if (format == ImageFormat::kRaw) {
    if (!options.snapshot.empty()) {
      return Error::InvalidArgument("'" + path + "' is a raw image; only qcow2 images have snapshots")
          .set_path(path);
    }
    return WrapRaw(std::move(file), path);
  }
  return OpenQcow2(std::move(file), path, opener, options);
}

Result<std::string> ProbeFormatName(BlockSource& file) {
  std::array<char, 512> head{};
  const uint64_t n = std::min<uint64_t>(head.size(), file.size_bytes());
  BARGE_RETURN_IF_ERROR(file.ReadAt(0, std::as_writable_bytes(std::span(head.data(), n))));
  const std::string_view h(head.data(), n);
  auto at = [&](size_t offset, std::string_view magic) { return h.substr(std::min(offset, h.size())).starts_with(magic); };
  if (at(0, std::string_view("QFI\xfb", 4))) return std::string("qcow2");
  if (at(0, std::string_view("QED\0", 4))) return std::string("qed");
  if (at(0, "KDMV") || at(0, "COWD") || at(0, "# Disk DescriptorFile")) return std::string("vmdk");
  if (at(0, "vhdxfile")) return std::string("vhdx");
  if (at(0, "conectix")) return std::string("vpc");
  if (at(64, std::string_view("\x7f\x10\xda\xbe", 4))) return std::string("vdi");
  if (at(0, std::string_view("LUKS\xba\xbe", 6))) return std::string("luks");
  if (at(0, "WithoutFreeSpace") || at(0, "WithouFreSpacExt")) return std::string("parallels");
  if (at(0, "Bochs Virtual HD Image")) return std::string("bochs");
  if (at(0, "#!/bin/sh\n#V2.0 Format\nmodprobe cloop")) return std::string("cloop");
  return std::string("raw");
}

Result<std::optional<ImageInfo>> ProbeQcow2Layer(const std::string& path, const SourceOpener& opener) {
  auto file = opener(path);
  if (!file.ok() || (*file)->size_bytes() < 4) return std::optional<ImageInfo>();
  std::array<std::byte, 4> magic;
  if (!(*file)->ReadAt(0, magic).ok() ||
      magic != std::array<std::byte, 4>{std::byte{'Q'}, std::byte{'F'}, std::byte{'I'}, std::byte{0xfb}}) {
    return std::optional<ImageInfo>();
  }
  OpenOptions o;
  o.format = ImageFormat::kQcow2;
  o.open_backing = false;
  o.open_data_file = false;
  o.allow_any_path = true;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Image> image, OpenQcow2(std::move(file).value(), path, opener, o));
  return std::optional<ImageInfo>(image->info());
}

}  // namespace barge::formats
