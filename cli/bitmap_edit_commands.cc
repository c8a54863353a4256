// barge bitmap add|remove|clear|enable|disable: qemu-img bitmap's edits of
// persistent dirty bitmaps, in place and crash-safe (pipeline/bitmap_edit.h),
// under QEMU's image lock.
#include <algorithm>

#include "blockio/env.h"
#include "cli/common.h"
#include "pipeline/bitmap_edit.h"

namespace barge::cli {
namespace {

using nlohmann::json;

using Action = pipeline::BitmapAction;

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

json BitmapsJson(const std::vector<formats::BitmapInfo>& bitmaps) {
  json arr = json::array();
  for (const auto& b : bitmaps) {
    arr.push_back({{"name", b.name}, {"granularity", b.granularity_bytes}, {"enabled", b.enabled}, {"in_use", b.in_use}});
  }
  return arr;
}

int RunEdit(const Verb& verb, const EditArgs& a, Output& out) {
  pipeline::BitmapEditRequest req{a.path, verb.action, a.names, 0, a.disabled};
  if (!a.granularity.empty()) {
    auto g = ParseSize(a.granularity);
    if (!g.ok()) return out.Usage("--granularity: " + g.error().message());
    if (Status s = pipeline::CheckBitmapGranularity(*g, a.granularity); !s.ok()) return out.Usage(s.error().message());
    req.granularity = *g;
  }
  auto r = pipeline::RunBitmapEdit(Env::Default(), req);
  if (!r.ok()) return out.Fail(r.error());
  const std::vector<std::string>& unchanged = r->unchanged;
  out.Result({{"image", a.path},
              {"action", verb.name},
              {"names", a.names},
              {"changed", unchanged.size() < a.names.size()},
              {"bitmaps", BitmapsJson(r->bitmaps)}});
  std::ostream& t = out.text();
  for (const auto& n : a.names) {
    if (std::find(unchanged.begin(), unchanged.end(), n) != unchanged.end()) {
      t << "bitmap " << n << " of " << a.path << " was already " << verb.past << "\n";
      continue;
    }
    t << verb.past << " bitmap " << n << (verb.action == Action::kAdd ? " to " : verb.action == Action::kRemove ? " from " : " of ")
      << a.path;
    if (verb.action == Action::kAdd) {
      t << " (granularity " << HumanBytes(r->granularity) << ", "
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
