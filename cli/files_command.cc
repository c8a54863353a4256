// barge files ls | get: files out of a point's filesystem, read through the
// verified export without restoring the disk (pipeline/files.h).
#include <iostream>

#include "cli/common.h"
#include "cli/http_flags.h"
#include "cli/owner_flag.h"
#include "formats/json_fields.h"
#include "formats/units.h"
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

// A name on one line of text: a line break, another control byte, a
// backslash, or (in a name that is not UTF-8) a byte from 0x80 up is
// written as \n, \t, \\ or \xHH, so every name shows on its own line
// and reads back unambiguously.
std::string Printable(const std::string& name) {
  const bool utf8 = formats::IsUtf8(name);
  std::string text;
  for (unsigned char c : name) {
    if (c == '\\') {
      text += "\\\\";
    } else if (c == '\n') {
      text += "\\n";
    } else if (c == '\t') {
      text += "\\t";
    } else if (c < 0x20 || c == 0x7f || (!utf8 && c >= 0x80)) {
      text += Format("\\x%02x", c);
    } else {
      text += static_cast<char>(c);
    }
  }
  return text;
}

// Fails with `error` on one line: a name in its file or message (a path
// in the point's filesystem, a destination) may hold a line break.
int Fail(Output& out, Error error) {
  Error one_line(error.code(), Printable(error.message()));
  one_line.set_errno(error.errno_value()).set_retryable(error.retryable()).set_path(Printable(error.path()));
  if (error.offset()) one_line.set_offset(*error.offset());
  if (error.offset() && error.length()) one_line.set_range(*error.offset(), *error.length());
  return out.Fail(one_line);
}

std::string Hex(const std::string& bytes) {
  std::string hex;
  for (unsigned char c : bytes) hex += Format("%02x", c);
  return hex;
}

// `key` holding `text`; and, where `text` is not UTF-8 (a JSON string
// cannot hold it: its bad bytes would show as U+FFFD), `key`_bytes with
// its bytes in hex.
void AddText(json& object, const std::string& key, const std::string& text) {
  object[key] = text;
  if (!formats::IsUtf8(text)) object[key + "_bytes"] = Hex(text);
}

const char* TypeName(const pipeline::FileEntry& e) {
  return e.is_directory() ? "folder" : e.is_regular() ? "file" : e.is_symlink() ? "link" : "other";
}

int RunLs(const FilesArgs& a, Output& out) {
  if (auto at = pipeline::ParsePointSelector(a.at); !at.ok()) return out.Usage("--at: " + at.error().message());
  auto r = pipeline::ListFiles(Env::Default(), a.Request(), a.path);
  if (!r.ok()) return Fail(out, r.error());
  json entries = json::array();
  for (const auto& e : r->entries) {
    json entry = json::object();
    AddText(entry, "name", e.name);
    entry["type"] = TypeName(e);
    entry["mode"] = e.mode & 07777;
    entry["size"] = e.size_bytes;
    entry["mtime"] = e.mtime ? json(formats::FormatRfc3339(*e.mtime)) : json(nullptr);
    if (e.is_symlink()) AddText(entry, "target", e.link_target);
    entries.push_back(entry);
    const std::string time = e.mtime ? formats::FormatRfc3339({e.mtime->seconds, 0}) : std::string(20, '-');
    out.text() << (e.is_directory() ? 'd' : e.is_regular() ? '-' : e.is_symlink() ? 'l' : '?') << " "
               << Format("%04o", e.mode & 07777) << " " << time << "  " << Printable(e.name)
               << (e.is_directory() ? "/" : "") << (e.is_symlink() ? " -> " + Printable(e.link_target) : "")
               << (e.is_regular() ? "  " + HumanBytes(e.size_bytes) : "") << "\n";
  }
  json result = PointJson(r->point);
  AddText(result, "path", a.path);
  result["entries"] = entries;
  out.Result(result);
  return kExitOk;
}

int RunGet(const FilesArgs& a, Output& out) {
  if (auto at = pipeline::ParsePointSelector(a.at); !at.ok()) return out.Usage("--at: " + at.error().message());
  if (a.dest == "-") {
    // The file's bytes are barge's whole stdout: no text, no result.
    if (out.json()) return out.Usage("- writes the file to standard output, where --json writes its events");
    auto r = pipeline::GetFileToStream(Env::Default(), a.Request(), a.path, std::cout);
    if (!r.ok()) return Fail(out, r.error());
    return kExitOk;
  }
  auto r = pipeline::GetFile(Env::Default(), a.Request(), a.path, a.dest);
  if (!r.ok()) return Fail(out, r.error());
  json result = PointJson(r->point);
  AddText(result, "path", a.path);
  AddText(result, "destination", r->destination);
  result["size"] = r->size_bytes;
  out.Result(result);
  out.text() << "copied " << Printable(a.path) << " of backup " << r->point.manifest.id << " to "
             << Printable(r->destination) << " (" << HumanBytes(r->size_bytes) << ", every cluster read verified)\n";
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
    AddBucketFlags(cmd);
  }
  {
    auto a = std::make_shared<FilesArgs>();
    auto* cmd = AddCommand(*group, "get", "Copy a file of a point's filesystem out", exit_code,
                           [a](Output& out) { return RunGet(*a, out); });
    a->AddTo(cmd);
    cmd->add_option("dest", a->dest,
                    "Where to write it: a new file, a folder to put it in under its own name, or - for standard "
                    "output")
        ->required();
    a->AddFlags(cmd);
    AddAllowOtherOwnerFlag(cmd);
    AddBucketFlags(cmd);
  }
}

}  // namespace barge::cli
