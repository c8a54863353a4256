#include "pipeline/bitmap_edit.h"

#include <algorithm>
#include <map>

#include "formats/qcow2_bitmap_edit.h"
#include "pipeline/endpoints.h"

namespace barge::pipeline {
namespace {

// The image's qcow2 metadata only (no backing chain, no data file).
Result<std::unique_ptr<formats::Image>> OpenMetadata(Env& env, const std::string& path) {
  formats::OpenOptions options;
  options.open_backing = false;
  options.open_data_file = false;
  ApplyFolderRule(options, path, options.allow_any_path, options.allowed_dirs);
  BARGE_ASSIGN_OR_RETURN(auto image, OpenImageFile(env, path, options));
  if (image->info().format != formats::ImageFormat::kQcow2) {
    return Error::NotSupported("not a qcow2 image: persistent bitmaps live in qcow2 files "
                               "(for a raw disk, create a CBT overlay: barge overlay create)")
        .set_path(path);
  }
  return image;
}

}  // namespace

uint32_t DefaultBitmapGranularity(uint64_t cluster_bytes) {
  return static_cast<uint32_t>(std::clamp<uint64_t>(cluster_bytes, 4096, 65536));
}

Status CheckBitmapGranularity(uint64_t bytes, const std::string& as_given) {
  if (bytes < 512 || bytes > (uint64_t{1} << 31) || (bytes & (bytes - 1)) != 0) {
    return Error::InvalidArgument("--granularity must be a power of two from 512 to 2G, not " + as_given);
  }
  return OkStatus();
}

Result<BitmapEditResult> RunBitmapEdit(Env& env, const BitmapEditRequest& req) {
  BARGE_ASSIGN_OR_RETURN(auto lock, env.LockImage(req.path, ImageAccess::kExclusiveWrite));
  BitmapEditResult out;
  formats::BitmapEdit edit;
  std::map<std::string, bool> enabled_before;
  {
    BARGE_ASSIGN_OR_RETURN(auto before, OpenMetadata(env, req.path));  // closed before the edit reads afresh
    const formats::ImageInfo& info = before->info();
    for (const auto& b : info.bitmaps) enabled_before[b.name] = b.enabled;
    switch (req.action) {
      case BitmapAction::kAdd:
        out.granularity = req.granularity ? static_cast<uint32_t>(req.granularity)
                                          : DefaultBitmapGranularity(info.cluster_size());
        for (const auto& n : req.names) edit.add.push_back(formats::BitmapSpec{n, out.granularity, !req.disabled, {}});
        break;
      case BitmapAction::kRemove: edit.remove = req.names; break;
      case BitmapAction::kClear: edit.clear = req.names; break;
      case BitmapAction::kEnable: edit.enable = req.names; break;
      case BitmapAction::kDisable: edit.disable = req.names; break;
    }
  }
  BARGE_RETURN_IF_ERROR(formats::EditBitmaps(
      req.path, [&env](const std::string& p) { return env.OpenSource(p); },
      [&env](const std::string& p) { return env.OpenSink(p, SinkMode::kExisting); }, edit));
  BARGE_ASSIGN_OR_RETURN(auto after, OpenMetadata(env, req.path));
  out.bitmaps = after->info().bitmaps;
  // Enabling an enabled bitmap changes nothing: the caller says so.
  if (req.action == BitmapAction::kEnable || req.action == BitmapAction::kDisable) {
    const bool want = req.action == BitmapAction::kEnable;
    for (const auto& n : req.names) {
      if (enabled_before[n] == want) out.unchanged.push_back(n);
    }
  }
  return out;
}

}  // namespace barge::pipeline
