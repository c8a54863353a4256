// barge image add|sync|status|rescan|cleanup: the backing-image catalog
// (copies per disk folder, delivered from ready copies).
#include <iostream>
#include <sstream>

#include "cli/common.h"
#include "cli/copy_flags.h"
#include "orchestrate/catalog_path.h"
#include "orchestrate/image_catalog.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct CatalogArgs {
  std::string catalog;
  std::string name, source, expected_sha512, disk, disks, unused_for = "24h";
  CopyFlags copy;
  bool verify = false;
  bool as_json = false;
};

Result<std::unique_ptr<orchestrate::ImageCatalog>> OpenCatalog(const CatalogArgs& a) {
  return orchestrate::ImageCatalog::Open(orchestrate::ResolveCatalogPath(a.catalog));
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

json CopyJson(const orchestrate::ImageCopyRecord& c) {
  json j = {{"image", c.image}, {"disk", c.disk},   {"path", c.path},       {"state", c.state},
            {"percent", c.percent}, {"sender", c.sender}, {"updated", c.updated}};
  if (!c.message.empty()) j["message"] = c.message;
  if (c.unused_since) j["unused_since"] = c.unused_since;
  if (!c.owner.empty()) j["owner"] = c.owner;
  return j;
}

void PrintCopy(const orchestrate::ImageCopyRecord& c) {
  std::cout << c.image << "  " << c.disk << "  " << c.state;
  if (c.state == "in-progress") std::cout << " " << static_cast<int>(c.percent) << "%";
  if (!c.message.empty()) std::cout << ": " << c.message;
  std::cout << "\n";
}

Status ApplyCopy(const CatalogArgs& a, pipeline::ReplicateOptions& o) {
  CompressionChoice compression;
  BARGE_RETURN_IF_ERROR(a.copy.Apply(o.copy, compression));
  o.verify = a.verify;
  o.copy.stall_timeout = std::chrono::seconds(60);
  return OkStatus();
}

int RunAdd(const CatalogArgs& a) {
  pipeline::ReplicateOptions o;
  if (Status s = ApplyCopy(a, o); !s.ok()) return ReportError(s.error());
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return ReportError(cat.error());
  auto r = (*cat)->Add(a.name, a.source, a.expected_sha512, a.disk, o);
  if (!r.ok()) return ReportError("image add", r.error());
  if (a.as_json) PrintJson(CopyJson(*r));
  else PrintCopy(*r);
  return r->state == "ready" ? kExitOk : kExitError;
}

int RunSync(const CatalogArgs& a) {
  orchestrate::SyncOptions o;
  if (Status s = ApplyCopy(a, o.replicate); !s.ok()) return ReportError(s.error());
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return ReportError(cat.error());
  auto r = (*cat)->Sync(a.name, SplitList(a.disks), o);
  if (!r.ok()) return ReportError("image sync", r.error());
  bool ok = true;
  for (const auto& c : r->copies) ok = ok && c.state == "ready";
  if (a.as_json) {
    json copies = json::array(), senders = json::array();
    for (const auto& c : r->copies) copies.push_back(CopyJson(c));
    for (const auto& s : r->senders) {
      senders.push_back({{"sender", s.sender}, {"sends", s.sends}, {"max_concurrent", s.max_concurrent}});
    }
    PrintJson({{"image", a.name}, {"copies", copies}, {"senders", senders}});
  } else {
    for (const auto& c : r->copies) PrintCopy(c);
    for (const auto& s : r->senders) {
      std::cout << "sender " << s.sender << ": " << s.sends << " send(s), at most " << s.max_concurrent
                << " at once\n";
    }
  }
  return ok ? kExitOk : kExitError;
}

int RunStatus(const CatalogArgs& a) {
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return ReportError(cat.error());
  // Copies whose sending process is gone show as failed, not in progress.
  if (auto r = (*cat)->RecoverInterrupted(a.name); !r.ok()) return ReportError("image status", r.error());
  auto images = (*cat)->Images(a.name);
  if (!images.ok()) return ReportError(images.error());
  if (!a.name.empty() && images->empty()) return ReportError(Error::NotFound("no image '" + a.name + "'"));
  auto copies = (*cat)->Copies(a.name);
  if (!copies.ok()) return ReportError(copies.error());
  auto senders = (*cat)->Senders(a.name);
  if (!senders.ok()) return ReportError(senders.error());
  if (a.as_json) {
    json out = json::array();
    for (const auto& im : *images) {
      json cs = json::array(), ss = json::array();
      for (const auto& c : *copies) {
        if (c.image == im.name) cs.push_back(CopyJson(c));
      }
      for (const auto& s : *senders) {
        if (s.image == im.name) {
          ss.push_back({{"sender", s.sender}, {"sends", s.sends}, {"max_concurrent", s.max_concurrent}});
        }
      }
      out.push_back({{"name", im.name},
                     {"source", im.source},
                     {"sha512", im.sha512},
                     {"expected_sha512", im.expected_sha512},
                     {"format", im.format},
                     {"virtual_size", im.virtual_size},
                     {"copies", cs},
                     {"senders", ss}});
    }
    PrintJson(out);
    return kExitOk;
  }
  for (const auto& im : *images) {
    std::cout << im.name << " (" << im.format << ", " << HumanBytes(im.virtual_size) << ", sha512 "
              << im.sha512.substr(0, 16) << "...)\n";
    for (const auto& c : *copies) {
      if (c.image == im.name) {
        std::cout << "  ";
        PrintCopy(c);
      }
    }
  }
  return kExitOk;
}

int RunRescan(const CatalogArgs& a) {
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return ReportError(cat.error());
  if (Status s = (*cat)->Rescan(SplitList(a.disks)); !s.ok()) return ReportError("image rescan", s.error());
  return RunStatus(a);
}

int RunCleanup(const CatalogArgs& a) {
  auto interval = orchestrate::ParseDuration(a.unused_for);
  if (!interval.ok()) return ReportError(interval.error());
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return ReportError(cat.error());
  auto r = (*cat)->Cleanup(*interval);
  if (!r.ok()) return ReportError("image cleanup", r.error());
  if (a.as_json) {
    PrintJson({{"removed", r->removed}, {"in_use", r->in_use}, {"waiting", r->waiting}, {"busy", r->busy}});
    return kExitOk;
  }
  for (const auto& p : r->removed) std::cout << "removed " << p << "\n";
  for (const auto& p : r->in_use) std::cout << "in use  " << p << "\n";
  for (const auto& p : r->waiting) std::cout << "waiting " << p << "\n";
  for (const auto& p : r->busy) std::cout << "busy    " << p << "  (an add or sync of its image is running)\n";
  return kExitOk;
}

}  // namespace

void RegisterImageCatalogCommands(CLI::App& app, int& exit_code) {
  auto* image = app.add_subcommand("image", "Backing-image catalog: copies per disk, delivered from ready copies");
  image->require_subcommand(1);
  auto add_common = [](CLI::App* cmd, CatalogArgs& a) {
    cmd->add_option("--catalog", a.catalog, "SQLite catalog (default $BARGE_CATALOG, else ~/.local/state/barge)");
    cmd->add_flag("--json", a.as_json, "Print JSON");
  };
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = image->add_subcommand("add", "Prepare the first ready copy of an image on a disk folder");
    cmd->add_option("name", a->name, "Image name (the copy's file name)")->required();
    cmd->add_option("--source", a->source, "Raw/qcow2 file, block device or nbd:// URI")->required();
    cmd->add_option("--expected-sha512", a->expected_sha512, "SHA-512 of the logical content");
    cmd->add_option("--disk", a->disk, "Disk folder for the first copy")->required();
    cmd->add_flag("--verify", a->verify, "Re-read the copy and compare digests");
    a->copy.AddTo(cmd, "none");
    add_common(cmd, *a);
    cmd->callback([a, &exit_code]() { exit_code = RunAdd(*a); });
  }
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = image->add_subcommand("sync", "Deliver an image to disks from its ready copies (3 sends per copy)");
    cmd->add_option("name", a->name, "Image name")->required();
    cmd->add_option("--disks", a->disks, "Disk folders, comma separated")->required();
    cmd->add_flag("--verify", a->verify, "Re-read each copy and compare digests");
    a->copy.AddTo(cmd, "none");
    add_common(cmd, *a);
    cmd->callback([a, &exit_code]() { exit_code = RunSync(*a); });
  }
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = image->add_subcommand("status", "Per disk: pending, in-progress (percent), ready, failed");
    cmd->add_option("name", a->name, "Image name (default: all)");
    add_common(cmd, *a);
    cmd->callback([a, &exit_code]() { exit_code = RunStatus(*a); });
  }
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = image->add_subcommand("rescan", "Rebuild the catalog's copies from the disks' checksum records");
    cmd->add_option("--disks", a->disks, "Disk folders, comma separated (default: every known disk)");
    add_common(cmd, *a);
    cmd->callback([a, &exit_code]() { exit_code = RunRescan(*a); });
  }
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = image->add_subcommand(
        "cleanup", "Remove copies no qcow2 in their disk folder uses, once unused for the interval");
    cmd->add_option("--unused-for", a->unused_for, "Interval: 90s, 15m, 2h, 7d, 0")->capture_default_str();
    add_common(cmd, *a);
    cmd->callback([a, &exit_code]() { exit_code = RunCleanup(*a); });
  }
}

}  // namespace barge::cli
