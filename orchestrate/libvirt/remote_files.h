// Files on a libvirt host, through its storage driver (the only way to a
// remote host's files that libvirt's API offers): a folder is a storage
// pool (one that already covers it, else a transient dir pool made for
// the job), a file in it a volume, created, written and read back over
// libvirt's streams, and deleted. Used where barge puts small files of its
// own next to a remote domain's disks (instant restore's overlay, CBT
// overlays).
#pragma once

#include <libvirt/libvirt.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "blockio/error.h"

namespace barge::orchestrate {

struct VirPoolDeleter {
  void operator()(virStoragePoolPtr p) const { virStoragePoolFree(p); }
};
struct VirVolDeleter {
  void operator()(virStorageVolPtr v) const { virStorageVolFree(v); }
};
using VirPool = std::unique_ptr<virStoragePool, VirPoolDeleter>;
using VirVol = std::unique_ptr<virStorageVol, VirVolDeleter>;

// The storage pool over folder `dir` (absolute, as the host names it) of
// the connection's host, started and refreshed: a pool that already covers
// it, else the transient pool named `*transient` when that one still runs
// (made by an earlier run), else a new transient dir pool `name`, whose
// name is then stored in `*transient`. The caller stops a transient pool
// with CloseRemoteFolder when done (its files stay).
Result<VirPool> OpenRemoteFolder(virConnectPtr conn, const std::string& dir, const std::string& name,
                                 std::string* transient);
// Stops the pool when `transient` names it (a transient pool is then gone);
// a pool barge did not make is left alone.
Status CloseRemoteFolder(virStoragePoolPtr pool, const std::string& transient);

bool RemoteFileExists(virStoragePoolPtr pool, const std::string& name);
// A new folder `name` in the pool's folder, made fresh by the host's
// libvirt (mkdir: an error, never a reuse, when the name exists) with
// permission bits `mode` and owner `uid`:`gid` (-1: libvirt's own). Removed
// with DeleteRemoteFile once empty.
Status CreateRemoteFolder(virStoragePoolPtr pool, const std::string& name, uint32_t mode, int64_t uid, int64_t gid);
// OkStatus when there is no such file.
Status DeleteRemoteFile(virStoragePoolPtr pool, const std::string& name);
// A new file `name` (format "raw" or "qcow2", no backing) of `size` bytes,
// replacing one of that name; "raw" is a sparse file of zeros. `mode`
// (e.g. 0644): its permission bits; 0 leaves them to libvirt (0600).
Status CreateRemoteFile(virStoragePoolPtr pool, const std::string& name, const std::string& format, uint64_t size,
                        uint32_t mode = 0);

// What libvirt says of a file: its size in bytes (a raw file's length) and
// owner and mode (has_owner false when libvirt does not report them).
struct RemoteFileInfo {
  std::string path;
  uint64_t size = 0;
  bool has_owner = false;
  uint32_t uid = 0, gid = 0, mode = 0;
};
Result<RemoteFileInfo> StatRemoteFile(virStoragePoolPtr pool, const std::string& name);

// Writes `bytes` into the existing file `name` at `offset` (the file keeps
// its size when they fit in it) through a libvirt stream.
Status UploadRemoteFile(virStoragePoolPtr pool, const std::string& name, uint64_t offset,
                        std::span<const std::byte> bytes);
// Reads `expected.size()` bytes of file `name` at `offset` back through a
// libvirt stream: kIoError naming the first offset that differs, or a
// short file.
Status CheckRemoteFile(virStoragePoolPtr pool, const std::string& name, uint64_t offset,
                       std::span<const std::byte> expected);

}  // namespace barge::orchestrate
