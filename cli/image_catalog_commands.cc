// barge image add|sync|status|rescan|cleanup: the backing-image catalog
// (copies per disk folder, delivered from ready copies).
#include <algorithm>
#include <sstream>

#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/http_flags.h"
#include "cli/interrupt.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/catalog/image_catalog.h"
#include "orchestrate/catalog/image_catalog_report.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct CatalogArgs {
  std::string catalog;
  std::string name, source, expected_sha512, disk, disks, unused_for = "24h";
  CopyFlags copy;
  HttpFlags http;  // image add; image sync's download from the origin
  uint64_t size_bytes = 0;  // image add --source -: the stream's declared length
  bool verify = false;
  bool dry_run = false;
};

Result<std::unique_ptr<orchestrate::ImageCatalog>> OpenCatalog(const CatalogArgs& a) {
  BARGE_ASSIGN_OR_RETURN(std::string path, orchestrate::CatalogPathFromFlag(Env::Default(), a.catalog));
  return orchestrate::ImageCatalog::Open(Env::Default(), path);
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

// Catalog rows keep epoch seconds; JSON and text show RFC 3339.
std::string Time(int64_t epoch_seconds) { return formats::FormatRfc3339({epoch_seconds, 0}); }

json CopyJson(const orchestrate::ImageCopyRecord& c) {
  json j = {{"image", c.image}, {"disk", c.disk},   {"path", c.path},       {"state", c.state},
            {"percent", c.percent}, {"sender", c.sender}, {"updated_at", Time(c.updated)}};
  if (!c.message.empty()) j["message"] = c.message;
  if (c.unused_since) j["unused_since"] = Time(c.unused_since);
  if (!c.owner.empty()) j["owner"] = c.owner;
  if (c.bytes_total) {
    j["bytes_done"] = c.bytes_done;
    j["bytes_total"] = c.bytes_total;
  }
  return j;
}

Status ApplyCopy(const CatalogArgs& a, pipeline::ReplicateOptions& o) {
  formats::CompressionSpec compression;
  BARGE_RETURN_IF_ERROR(a.copy.Apply(o.copy, compression));
  o.verify = a.verify;
  o.copy.stall_timeout = std::chrono::seconds(60);
  return OkStatus();
}

int RunAdd(const CatalogArgs& a, Output& out) {
  pipeline::ReplicateOptions o;
  if (Status s = ApplyCopy(a, o); !s.ok()) return out.Usage(s.error().message());
  auto http = a.http.OptionsFor(out, a.source);
  if (!http.ok()) return out.Usage(http.error().message());
  o.source_http = std::move(http).value();
  WarnIfMisnamed(out, a.source, "");
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return out.Fail(cat.error());
  orchestrate::UploadSpec upload;
  upload.size_bytes = a.size_bytes;
  if (a.size_bytes != 0 && a.source != orchestrate::kUploadSource) {
    return out.Usage("--size declares the length of an upload on standard input (--source -); a file or URL "
                     "says its own");
  }
  auto r = (*cat)->Add(a.name, a.source, a.expected_sha512, a.disk, o, upload);
  if (!r.ok()) return out.Fail(r.error());
  out.Result({{"copy", CopyJson(*r)}});
  out.text() << orchestrate::CopyLine(*r);
  if (auto failure = orchestrate::AddFailure(*r)) return out.Fail(*failure);
  return kExitOk;
}

int RunSync(const CatalogArgs& a, Output& out) {
  orchestrate::SyncOptions o;
  if (Status s = ApplyCopy(a, o.replicate); !s.ok()) return out.Usage(s.error().message());
  o.origin_http = a.http.options;
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return out.Fail(cat.error());
  auto r = (*cat)->Sync(a.name, SplitList(a.disks), o);
  if (!r.ok()) return out.Fail(r.error());
  if (CancelFlag().load()) return out.Fail(Error::Cancelled("image sync of " + a.name + " interrupted"));
  json copies = json::array(), senders = json::array();
  for (const auto& c : r->copies) copies.push_back(CopyJson(c));
  for (const auto& s : r->senders) {
    senders.push_back({{"sender", s.sender}, {"sends", s.sends}, {"max_concurrent", s.max_concurrent}});
  }
  json result = {{"image", a.name}, {"copies", copies}, {"senders", senders}};
  if (!r->downloaded_from.empty()) result["downloaded_from"] = r->downloaded_from;
  out.Result(result);
  out.text() << orchestrate::SyncText(a.name, *r);
  // The first copy that is not ready names the error; the result lists each.
  if (auto failure = orchestrate::SyncFailure(*r)) return out.Fail(*failure);
  return kExitOk;
}

int RunStatus(const CatalogArgs& a, Output& cli_out) {
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return cli_out.Fail(cat.error());
  // Copies whose sending process is gone show as failed, not in progress.
  auto status = orchestrate::ReadImageCatalogStatus(**cat, a.name);
  if (!status.ok()) return cli_out.Fail(status.error());
  {
    json out = json::array();
    for (const auto& im : status->images) {
      json cs = json::array(), ss = json::array();
      for (const auto& c : status->copies) {
        if (c.image == im.name) cs.push_back(CopyJson(c));
      }
      for (const auto& s : status->senders) {
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
    cli_out.Result({{"images", out}});
  }
  cli_out.text() << orchestrate::ImageStatusText(*status);
  return kExitOk;
}

int RunRescan(const CatalogArgs& a, Output& out) {
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return out.Fail(cat.error());
  if (Status s = (*cat)->Rescan(SplitList(a.disks)); !s.ok()) return out.Fail(s.error());
  return RunStatus(a, out);
}

int RunCleanup(const CatalogArgs& a, Output& out) {
  auto interval = formats::ParseDurationSeconds(a.unused_for);
  if (!interval.ok()) return out.Usage("--unused-for: " + interval.error().message());
  auto cat = OpenCatalog(a);
  if (!cat.ok()) return out.Fail(cat.error());
  auto r = (*cat)->Cleanup(std::chrono::seconds(*interval), a.dry_run);
  if (!r.ok()) return out.Fail(r.error());
  out.Result({{"removed", r->removed},
              {"in_use", r->in_use},
              {"waiting", r->waiting},
              {"busy", r->busy},
              {"last_copy", r->last_copy},
              {"dry_run", r->dry_run}});
  out.text() << orchestrate::CleanupText(*r);
  return kExitOk;
}

}  // namespace

void RegisterImageCatalogCommands(CLI::App& app, int& exit_code) {
  auto* image = AddGroup(app, "image", "Backing-image catalog: copies per disk, delivered from ready copies");
  auto add_common = [](CLI::App* cmd, CatalogArgs& a) {
    cmd->add_option("--catalog", a.catalog, "SQLite catalog (default $BARGE_CATALOG, else ~/.local/state/barge)");
  };
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = AddCommand(*image, "add", "Prepare the first ready copy of an image on a disk folder", exit_code,
                           [a](Output& out) { return RunAdd(*a, out); });
    cmd->add_option("name", a->name, "Image name (the copy's file name)")->required();
    cmd->add_option("--source", a->source,
                    "Raw/qcow2 file, block device, nbd:// URI, http(s):// URL, or - for standard input (an upload)")
        ->required();
    cmd->add_option("--size", a->size_bytes,
                    "--source -: the upload's length in bytes; a stream that ends sooner (or runs longer) is "
                    "refused")
        ->type_name("BYTES");
    cmd->add_option("--expected-sha512", a->expected_sha512, "SHA-512 of the logical content");
    cmd->add_option("--disk", a->disk, "Disk folder for the first copy")->required();
    cmd->add_flag("--verify", a->verify, "Re-read the copy and compare digests");
    a->http.AddTo(cmd);
    a->copy.AddTo(cmd, "none");
    add_common(cmd, *a);
  }
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = AddCommand(*image, "sync", "Deliver an image to disks from its ready copies (3 sends per copy)", exit_code,
                           [a](Output& out) { return RunSync(*a, out); });
    cmd->add_option("name", a->name, "Image name")->required();
    cmd->add_option("--disks", a->disks, "Disk folders, comma separated")->required();
    cmd->add_flag("--verify", a->verify, "Re-read each copy and compare digests");
    a->http.AddTo(cmd);  // when no ready copy is left: downloaded again from its origin URL
    a->copy.AddTo(cmd, "none");
    add_common(cmd, *a);
  }
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = AddCommand(*image, "status", "Per disk: pending, in-progress (percent), ready, failed", exit_code,
                           [a](Output& out) { return RunStatus(*a, out); });
    cmd->add_option("name", a->name, "Image name (default: all)");
    add_common(cmd, *a);
  }
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = AddCommand(*image, "rescan", "Rebuild the catalog's copies from the disks' checksum records", exit_code,
                           [a](Output& out) { return RunRescan(*a, out); });
    cmd->add_option("--disks", a->disks, "Disk folders, comma separated (default: every known disk)");
    add_common(cmd, *a);
  }
  {
    auto a = std::make_shared<CatalogArgs>();
    auto* cmd = AddCommand(*image, "cleanup",
                           "Remove copies no qcow2 in their disk folder uses, once unused for the interval "
                           "(never an image's last ready copy)",
                           exit_code, [a](Output& out) { return RunCleanup(*a, out); });
    cmd->add_option("--unused-for", a->unused_for, "Interval: 90s, 15m, 2h, 7d, 0")->capture_default_str();
    cmd->add_flag("--dry-run", a->dry_run, "Say which copies would be removed; change nothing");
    add_common(cmd, *a);
  }
}

}  // namespace barge::cli
