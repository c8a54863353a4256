// barge files ls | get: files out of a point's filesystem, read through the
// verified export without restoring the disk (pipeline/files.h).
#include <iostream>

#include "cli/common.h"
#include "cli/owner_flag.h"
#include "pipeline/chain.h"
#include "pipeline/files.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct FilesArgs {
  std::string chain, at, path, dest;
  uint32_t partition = 0;
  void AddTo(CLI::App* cmd) {
    cmd->add_option("chain", chain, "The disk's chain folder (or a backup's manifest or image)")->required();
    cmd->add_option("path", path, "Absolute path in the point's filesystem (ext2/3/4)")->required();
  }
  void AddFlags(CLI::App* cmd) {
    cmd->add_option("--at", at,
                    "The point: latest (default), a position (0 = the oldest), a backup id, or an RFC 3339 time");
    cmd->add_option("--partition", partition, "The filesystem is in partition N of the disk (MBR or GPT), from 1")
        ->check(CLI::Range(1u, 128u));
  }
  pipeline::FilesRequest Request() const { return {chain, at, partition}; }
};

json PointJson(const pipeline::FilesPoint& p) {
  return {{"id", p.manifest.id}, {"position", p.position}, {"started_at", TimeJson(p.manifest.started_at)}};
}

int RunLs(const FilesArgs& a, Output& out) {
  if (auto at = pipeline::ParsePointSelector(a.at); !at.ok()) return out.Usage("--at: " + at.error().message());
  auto r = pipeline::ListFiles(Env::Default(), a.Request(), a.path);
  if (!r.ok()) return out.Fail(r.error());
  json entries = json::array();
  for (const auto& e : r->entries) {
    entries.push_back({{"name", e.name},
                       {"type", e.is_directory() ? "folder" : e.is_regular() ? "file" : "other"},
                       {"mode", e.mode & 07777},
                       {"size", e.size_bytes}});
    out.text() << (e.is_directory() ? "d " : e.is_regular() ? "- " : "? ") << e.name
               << (e.is_directory() ? "/" : "") << (e.is_regular() ? "  " + HumanBytes(e.size_bytes) : "") << "\n";
  }
  json result = PointJson(r->point);
  result["path"] = a.path;
  result["entries"] = entries;
  out.Result(result);
  return kExitOk;
}

int RunGet(const FilesArgs& a, Output& out) {
  if (auto at = pipeline::ParsePointSelector(a.at); !at.ok()) return out.Usage("--at: " + at.error().message());
  auto r = pipeline::GetFile(Env::Default(), a.Request(), a.path, a.dest);
  if (!r.ok()) return out.Fail(r.error());
  json result = PointJson(r->point);
  result["path"] = a.path;
  result["destination"] = a.dest;
  result["size"] = r->size_bytes;
  out.Result(result);
  out.text() << "copied " << a.path << " of backup " << r->point.manifest.id << " to " << a.dest << " ("
             << HumanBytes(r->size_bytes) << ", every cluster read verified)\n";
  return kExitOk;
}

}  // namespace

void RegisterFilesCommands(CLI::App& app, int& exit_code) {
  auto* group = AddGroup(app, "files", "Files of a point's filesystem (ext2/3/4), read verified without restoring");
  {
    auto a = std::make_shared<FilesArgs>();
    auto* cmd = AddCommand(*group, "ls", "List a folder of a point's filesystem", exit_code,
                           [a](Output& out) { return RunLs(*a, out); });
    a->AddTo(cmd);
    a->AddFlags(cmd);
    AddAllowOtherOwnerFlag(cmd);
  }
  {
    auto a = std::make_shared<FilesArgs>();
    auto* cmd = AddCommand(*group, "get", "Copy a file of a point's filesystem out", exit_code,
                           [a](Output& out) { return RunGet(*a, out); });
    a->AddTo(cmd);
    cmd->add_option("dest", a->dest, "Where to write it (a new file)")->required();
    a->AddFlags(cmd);
    AddAllowOtherOwnerFlag(cmd);
  }
}

}  // namespace barge::cli
