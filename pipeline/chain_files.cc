// Chain files opened without following or waiting, and the folder owner check.
#include "pipeline/chain_files.h"

#include <unistd.h>

#include <atomic>

#include "blockio/path.h"
#include "formats/units.h"

namespace barge::pipeline {

namespace {
std::atomic<bool> g_allow_other_owner{false};
}  // namespace

FileOptions ChainFileOptions() {
  FileOptions o;
  o.use_uring = false;
  o.no_follow = true;
  o.regular_only = true;
  return o;
}

Result<std::string> ReadChainFile(Env& env, const std::string& path, uint64_t max_bytes) {
  // The size from the entry itself (a link's target is never looked at).
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.StatNoFollow(path));
  if (st.is_regular() && st.size_bytes > max_bytes) {
    return Error::Corruption("file is too large (" + formats::HumanBytesExact(st.size_bytes) + ")").set_path(path);
  }
  return env.ReadOwnFile(path, max_bytes);
}

void SetAllowOtherOwner(bool allow) { g_allow_other_owner.store(allow); }
bool AllowOtherOwner() { return g_allow_other_owner.load(); }

Status CheckFolderOwner(Env& env, const std::string& dir) {
  if (AllowOtherOwner()) return OkStatus();
  const uint32_t me = static_cast<uint32_t>(::geteuid());
  // Root's own folders are trusted by every user (/, /srv, a sticky /tmp).
  auto trusted = [me](uint32_t uid) { return uid == me || uid == 0; };
  auto refuse = [&](const std::string& path, uint32_t uid, const std::string& what) {
    return Error::InvalidArgument(what + " belongs to another user (uid " + std::to_string(uid) + ", not " +
                                  std::to_string(me) +
                                  "), who could lead barge's writes elsewhere: refused; pass --allow-other-owner "
                                  "if this is intended")
        .set_path(path);
  };
  std::string path = LexicallyNormal(AbsolutePath(dir));
  // The folder itself (and a link at its name), then the nearest existing
  // folder above it: the one it is (or will be) made in.
  bool first = true;
  for (;;) {
    auto link = env.StatNoFollow(path);
    if (link.ok()) {
      if (link->is_symlink() && !trusted(link->uid)) {
        return refuse(first ? dir : path, link->uid, "the symbolic link " + path);
      }
      auto st = env.Stat(path);
      if (!st.ok()) return st.error().code() == ErrorCode::kNotFound ? OkStatus() : Status(st.error());
      if (!trusted(st->uid)) return refuse(first ? dir : path, st->uid, first ? "the folder" : "the folder holding it");
      if (!first) return OkStatus();
    } else if (link.error().code() != ErrorCode::kNotFound) {
      return link.error();
    }
    if (path == "/") return OkStatus();
    path = DirName(path);
    first = false;
  }
}

}  // namespace barge::pipeline
