// barge bitmap add|remove|clear|enable|disable: qemu-img bitmap's edits of
// persistent dirty bitmaps, in place and crash-safe (formats/qcow2_bitmap_edit.h),
// under QEMU's image lock.
#include <algorithm>
#include <map>

#include "blockio/env.h"
#include "cli/common.h"
#include "formats/qcow2_bitmap_edit.h"

namespace barge::cli {
namespace {

using nlohmann::json;

enum class Action { kAdd, kRemove, kClear, kEnable, kDisable };

struct Verb {
  Action action;
  const char* name;      // the subcommand
  const char* past;      // for the text output
  const char* help;
};

constexpr Verb kVerbs[] = {
    {Action::kAdd, "add", "added", "Add empty persistent bitmaps (qemu-img bitmap --add)"},
    {Action::kRemove, "remove", "removed", "Remove bitmaps and free their clusters (qemu-img bitmap --remove)"},
    {Action::kClear, "clear", "cleared", "Mark every block of bitmaps clean (qemu-img bitmap --clear)"},
    {Action::kEnable, "enable", "enabled", "Let bitmaps track writes again (qemu-img bitmap --enable)"},
    {Action::kDisable, "disable", "disabled", "Freeze bitmaps: writes are no longer tracked (qemu-img bitmap --disable)"},
};

struct EditArgs {
  std::string path;
  std::vector<std::string> names;
  std::string granularity;  // add: "" = qemu's default
  bool disabled = false;    // add
};

// qemu-img's default granularity: the cluster size, within 4 KiB..64 KiB
// (bdrv_get_default_bitmap_granularity).
uint32_t DefaultGranularity(uint64_t cluster_bytes) {
  return static_cast<uint32_t>(std::clamp<uint64_t>(cluster_bytes, 4096, 65536));
}

// The image's qcow2 metadata only (no backing chain, no data file).
Result<std::unique_ptr<formats::Image>> OpenMetadata(const std::string& path) {
  formats::OpenOptions options;
  options.open_backing = false;
  options.open_data_file = false;
  BARGE_ASSIGN_OR_RETURN(auto image, OpenImageFile(path, options));
  if (image->info().format != formats::ImageFormat::kQcow2) {
    return Error::NotSupported("not a qcow2 image: persistent bitmaps live in qcow2 files "
                               "(for a raw disk, create a CBT overlay: barge overlay create)")
        .set_path(path);
  }
  return image;
}

json BitmapsJson(const std::vector<formats::BitmapInfo>& bitmaps) {
  json arr = json::array();
  for (const auto& b : bitmaps) {
    arr.push_back({{"name", b.name}, {"granularity", b.granularity_bytes}, {"enabled", b.enabled}, {"in_use", b.in_use}});
  }
  return arr;
}

int RunEdit(const Verb& verb, const EditArgs& a, Output& out) {
  uint64_t granularity = 0;
  if (!a.granularity.empty()) {
    auto g = ParseSize(a.granularity);
    if (!g.ok()) return out.Usage("--granularity: " + g.error().message());
    if (*g < 512 || *g > (uint64_t{1} << 31) || (*g & (*g - 1)) != 0) {
      return out.Usage("--granularity must be a power of two from 512 to 2G, not " + a.granularity);
    }
    granularity = *g;
  }
  Env& env = Env::Default();
  // QEMU's own lock first: a running VM (or qemu-img, qemu-nbd) keeps its
  // copy of the bitmaps in memory and would overwrite the edit.
  auto lock = env.LockImage(a.path, ImageAccess::kExclusiveWrite);
  if (!lock.ok()) return out.Fail(lock.error());
  auto before = OpenMetadata(a.path);
  if (!before.ok()) return out.Fail(before.error());
  const formats::ImageInfo& info = (*before)->info();

  formats::BitmapEdit edit;
  switch (verb.action) {
    case Action::kAdd: {
      const uint32_t g = granularity ? static_cast<uint32_t>(granularity) : DefaultGranularity(info.cluster_size());
      for (const auto& n : a.names) edit.add.push_back(formats::BitmapSpec{n, g, !a.disabled, {}});
      break;
    }
    case Action::kRemove: edit.remove = a.names; break;
    case Action::kClear: edit.clear = a.names; break;
    case Action::kEnable: edit.enable = a.names; break;
    case Action::kDisable: edit.disable = a.names; break;
  }
  std::map<std::string, bool> enabled_before;
  for (const auto& b : info.bitmaps) enabled_before[b.name] = b.enabled;
  before->reset();  // the edit reads the file afresh

  Status s = formats::EditBitmaps(
      a.path, [&env](const std::string& p) { return env.OpenSource(p); },
      [&env](const std::string& p) { return env.OpenSink(p, SinkMode::kExisting); }, edit);
  if (!s.ok()) return out.Fail(s.error());
  auto after = OpenMetadata(a.path);
  if (!after.ok()) return out.Fail(after.error());
  const auto& bitmaps = (*after)->info().bitmaps;

  // Enabling an enabled bitmap changes nothing; say so.
  std::vector<std::string> unchanged;
  if (verb.action == Action::kEnable || verb.action == Action::kDisable) {
    const bool want = verb.action == Action::kEnable;
    for (const auto& n : a.names) {
      if (enabled_before[n] == want) unchanged.push_back(n);
    }
  }
  out.Result({{"image", a.path},
              {"action", verb.name},
              {"names", a.names},
              {"changed", unchanged.size() < a.names.size()},
              {"bitmaps", BitmapsJson(bitmaps)}});
  std::ostream& t = out.text();
  for (const auto& n : a.names) {
    if (std::find(unchanged.begin(), unchanged.end(), n) != unchanged.end()) {
      t << "bitmap " << n << " of " << a.path << " was already " << verb.past << "\n";
      continue;
    }
    t << verb.past << " bitmap " << n << (verb.action == Action::kAdd ? " to " : verb.action == Action::kRemove ? " from " : " of ")
      << a.path;
    if (verb.action == Action::kAdd) {
      t << " (granularity " << HumanBytes(edit.add.front().granularity_bytes) << ", "
        << (a.disabled ? "disabled" : "enabled") << ")";
    }
    t << "\n";
  }
  return kExitOk;
}

}  // namespace

void RegisterBitmapEditCommands(CLI::App& app, int& exit_code) {
  CLI::App* bitmap = app.get_subcommand("bitmap");  // made by RegisterBitmapCommands
  for (const Verb& verb : kVerbs) {
    auto args = std::make_shared<EditArgs>();
    auto* cmd = AddCommand(*bitmap, verb.name, verb.help, exit_code,
                           [args, &verb](Output& out) { return RunEdit(verb, *args, out); });
    cmd->add_option("image", args->path, "qcow2 image (not open in QEMU)")->required();
    cmd->add_option("name", args->names, "Bitmap name(s); several are edited in one crash-safe step")
        ->required();
    if (verb.action == Action::kAdd) {
      cmd->add_option("-g,--granularity", args->granularity,
                      "Bytes each bit covers, a power of two (default: the cluster size within 4K..64K, as qemu-img)");
      cmd->add_flag("--disabled,--disable", args->disabled, "Add the bitmap disabled (not tracking writes)");
    }
  }
}

}  // namespace barge::cli
