// nbdkit-barge-plugin.so: serves one point of a barge chain folder over NBD,
// read-only, every cluster checked against the point's digests
// (pipeline/point_reader.h). Usage: nbdkit barge chain=DIR [at=POINT];
// docs/export.md.
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "blockio/env.h"
#include "pipeline/chain_files.h"
#include "pipeline/point_reader.h"

namespace {

using barge::Env;
using barge::Error;
using barge::ErrorCode;
using barge::pipeline::PointReader;

// Set by .config before any thread starts; read-only afterwards.
std::string chain_dir;
std::string at = "latest";
// Opened in .after_fork (after nbdkit daemonizes, so file descriptors and
// any io_uring rings belong to the serving process); shared by every
// connection. PointReader is thread-safe.
std::unique_ptr<PointReader> reader;

int ErrnoOf(const Error& e) {
  switch (e.code()) {
    case ErrorCode::kInvalidArgument:
      return EINVAL;
    case ErrorCode::kNoSpace:
      return ENOSPC;
    default:
      return EIO;  // a damaged cluster is EIO, as an unreadable sector is
  }
}

int Fail(const Error& e) {
  nbdkit_error("barge: %s", e.ToString().c_str());
  nbdkit_set_error(ErrnoOf(e));
  return -1;
}

int BargeConfig(const char* key, const char* value) {
  if (std::strcmp(key, "chain") == 0) {
    char* path = nbdkit_absolute_path(value);
    if (path == nullptr) return -1;
    chain_dir = path;
    free(path);
    return 0;
  }
  if (std::strcmp(key, "at") == 0) {
    at = value;
    return 0;
  }
  if (std::strcmp(key, "allow-other-owner") == 0) {
    // barge export/files --allow-other-owner: a chain folder another user
    // owns is served (pipeline/chain_files.h).
    int allow = nbdkit_parse_bool(value);
    if (allow < 0) return -1;
    barge::pipeline::SetAllowOtherOwner(allow != 0);
    return 0;
  }
  nbdkit_error("barge: unknown parameter '%s' (takes chain=DIR, at=POINT and allow-other-owner=BOOL)", key);
  return -1;
}

int BargeConfigComplete() {
  if (chain_dir.empty()) {
    nbdkit_error("barge: chain=DIR is required (the chain folder of one disk)");
    return -1;
  }
  return 0;
}

// Before serving: the whole check (lock, chain, point, structure of every
// layer), so a damaged or busy chain stops nbdkit before it listens.
int BargeGetReady() {
  auto r = PointReader::Open(Env::Default(), chain_dir, at);
  if (!r.ok()) return Fail(r.error());
  reader = std::move(r).value();
  // A read-only chain folder (nbdkit -v shows it).
  if (!reader->lock_note().empty()) nbdkit_debug("barge: %s: %s", chain_dir.c_str(), reader->lock_note().c_str());
  return 0;
}

// Reopened in the serving process: a daemonizing nbdkit forks after
// get_ready. The structure was checked there, and the lock taken there is
// inherited and kept until the new reader holds its own.
int BargeAfterFork() {
  auto r = PointReader::Open(Env::Default(), chain_dir, at, /*check_structure=*/false);
  if (!r.ok()) return Fail(r.error());
  reader = std::move(r).value();
  return 0;
}

void BargeUnload() { reader.reset(); }

void* BargeOpen(int /*readonly*/) {
  // One reader for every connection; the handle only needs to be non-null.
  return reader.get();
}

int64_t BargeGetSize(void* /*handle*/) { return static_cast<int64_t>(reader->size_bytes()); }

int BargeCanMultiConn(void* /*handle*/) { return 1; }
int BargeCanExtents(void* /*handle*/) { return 1; }
int BargeCanCache(void* /*handle*/) { return NBDKIT_CACHE_NONE; }

int BargeBlockSize(void* /*handle*/, uint32_t* minimum, uint32_t* preferred, uint32_t* maximum) {
  *minimum = 1;
  // A cluster is read and checked whole, so whole clusters cost least.
  *preferred = std::max<uint32_t>(4096, std::min<uint32_t>(reader->cluster_bytes(), 2u << 20));
  *maximum = 0xffffffff;
  return 0;
}

int BargePread(void* /*handle*/, void* buf, uint32_t count, uint64_t offset, uint32_t /*flags*/) {
  barge::Status s = reader->Read(offset, std::span<std::byte>(static_cast<std::byte*>(buf), count));
  if (!s.ok()) return Fail(s.error());
  return 0;
}

int BargeExtents(void* /*handle*/, uint32_t count, uint64_t offset, uint32_t flags,
                 struct nbdkit_extents* extents) {
  // With REQ_ONE the first extent is enough; look a little further anyway
  // so one call covers a cluster run.
  uint64_t length = count;
  if (flags & NBDKIT_FLAG_REQ_ONE) length = std::min<uint64_t>(count, 64u << 20);
  auto list = reader->Extents(offset, length);
  if (!list.ok()) return Fail(list.error());
  for (const barge::Extent& e : *list) {
    uint32_t type = 0;
    if (e.kind == barge::ExtentKind::kZero) type = NBDKIT_EXTENT_ZERO;
    if (e.kind == barge::ExtentKind::kHole) type = NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO;
    if (nbdkit_add_extent(extents, e.offset, e.length, type) == -1) return -1;
  }
  return 0;
}

struct nbdkit_plugin MakePlugin() {
  struct nbdkit_plugin p = {};
  p.name = "barge";
  p.longname = "barge backup point (verified)";
  p.version = "0.1.0";
  p.description = "Serves one point of a barge chain folder, every cluster checked against its digest";
  p.unload = BargeUnload;
  p.config = BargeConfig;
  p.config_complete = BargeConfigComplete;
  p.config_help =
      "chain=<DIR>    (required) The chain folder of one disk.\n"
      "at=<POINT>     The point: latest (default), a position, an id or an RFC 3339 time.\n"
      "allow-other-owner=<BOOL>  Serve a chain folder another user owns (default false).";
  p.magic_config_key = "chain";
  p.get_ready = BargeGetReady;
  p.after_fork = BargeAfterFork;
  p.open = BargeOpen;
  p.get_size = BargeGetSize;
  p.can_multi_conn = BargeCanMultiConn;
  p.can_extents = BargeCanExtents;
  p.can_cache = BargeCanCache;
  p.block_size = BargeBlockSize;
  p.pread = BargePread;
  p.extents = BargeExtents;
  return p;
}

struct nbdkit_plugin plugin = MakePlugin();

}  // namespace

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN(plugin)
