// The backing-image catalog: per image and disk (a folder) the state of its
// copy (pending, in-progress with percent, ready, failed with a message),
// kept in SQLite and rebuildable by scanning the disks' checksum records.
// Delivery sends from ready copies, at most N (3) concurrent sends per
// sender, fewest active sends first. Add and sync of one image exclude each
// other across processes (a lock file per image); rows left pending or
// in-progress by a process that is gone are marked failed. Schema and
// locking: docs/replication.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "blockio/http_client.h"
#include "orchestrate/catalog/image_upload.h"
#include "pipeline/replicate.h"

namespace barge::orchestrate {

class SqliteDb;

struct ImageRecord {
  std::string name;
  std::string source;
  std::string expected_sha512;  // as given ("" = none)
  std::string sha512;           // of the first ready copy
  std::string format;
  uint64_t virtual_size = 0;
  int64_t created = 0;  // Unix seconds
};

struct ImageCopyRecord {
  std::string image;
  std::string disk;      // folder
  std::string path;      // disk/NAME plus the source's extension (disk/base.qcow2)
  std::string state;     // "pending", "in-progress", "ready", "failed"
  double percent = 0;
  std::string message;   // why it failed
  std::string sender;    // path of the copy it was sent from ("" = from the source)
  int64_t updated = 0;       // Unix seconds of the last state change
  int64_t unused_since = 0;  // Unix seconds; 0 = in use or not checked yet
  // Pending and in-progress rows: the process that will send or is sending
  // the copy (ProcessOwner::Encode() of orchestrate/base/file_lock.h); "" in
  // other states.
  std::string owner;
  // While in progress: bytes of the image copied so far and its size (the
  // progress `image status` shows; written with `percent`, at most once a
  // second). Kept as last written in other states.
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

// The last add of an image that failed: the image is not in the catalog
// (a failed add leaves no image or copy row), but `image status NAME` says
// why. Removed when an add of the name succeeds.
struct FailedAddRecord {
  std::string image;
  std::string disk;
  std::string source;   // as recorded: a URL without credentials
  std::string message;  // Error::ToString() of the failure
  int64_t updated = 0;  // Unix seconds
};

// The message of a copy whose sending process is gone (killed, crashed,
// machine rebooted) while it was pending or in progress.
inline constexpr const char* kInterruptedMessage = "interrupted (the sending process is gone)";

struct SenderRecord {
  std::string image;
  std::string sender;       // path of a ready copy
  int sends = 0;            // sends started from it
  int max_concurrent = 0;   // most sends it served at once
};

struct SyncOptions {
  int max_sends_per_sender = 3;
  pipeline::ReplicateOptions replicate;  // copy geometry, verify, stall timeout
  // TLS authorities and credentials for downloading the image again from
  // its origin URL (when no ready copy is left).
  HttpOptions origin_http;
};

struct SyncResult {
  std::vector<ImageCopyRecord> copies;  // of the disks asked for, after the sync
  std::vector<SenderRecord> senders;    // this sync's
  // The origin URL the image was downloaded from again, no ready copy being
  // left; "" when it was sent from ready copies only.
  std::string downloaded_from;
};

struct CleanupResult {
  std::vector<std::string> removed;  // paths
  std::vector<std::string> in_use;   // kept: a qcow2 in the disk's folder uses them
  std::vector<std::string> waiting;  // kept: unused for less than the interval
  std::vector<std::string> busy;     // kept: an add or sync of the image holds its lock
  std::vector<std::string> last_copy;  // kept: the image's last ready copy
  bool dry_run = false;              // nothing was removed: `removed` would be
};

// Thread-safe (one connection behind a mutex). Several processes may use
// one catalog at once (SQLite WAL; the per-image lock for add and sync).
class ImageCatalog {
 public:
  // Opens (creating file, folder and schema) the catalog at `db_path`.
  // Every file the catalog handles besides the database itself (disk
  // folders, copies and their records, lock files, /proc for owners) goes
  // through `env`, which must outlive the catalog.
  static Result<std::unique_ptr<ImageCatalog>> Open(Env& env, const std::string& db_path);
  ~ImageCatalog();
  ImageCatalog(const ImageCatalog&) = delete;
  ImageCatalog& operator=(const ImageCatalog&) = delete;

  // Prepares the first ready copy of `name` from `source` in `disk`
  // (DISK/NAME plus the source's extension), checked against
  // `expected_sha512` if given. An image of that name must not exist yet,
  // unless re-adding to a disk that failed; kInvalidArgument when that
  // file is another image's copy (`a` from x.qcow2 and `a.qcow2` from a
  // source without an extension).
  // Holds the image's lock throughout (kBusy, retryable, when another add
  // or sync of `name` holds it) and first recovers the image's interrupted
  // rows.
  // Returns the copy's record (state ready). A failed add returns its
  // error and leaves no row of the image (nor of its copy) behind: a copy
  // that never became ready is no copy; add again once the cause is fixed.
  // A killed add leaves an in-progress row, marked failed ("interrupted")
  // by the next command that recovers rows.
  // `source` "-" (kUploadSource) reads the image from `upload.fd`
  // (orchestrate/catalog/image_upload.h): its first bytes say qcow2 or raw
  // (the copy is NAME.qcow2 or NAME.raw), the rest is staged in a private
  // file beside the catalog, checked against upload.size_bytes, and copied
  // as a file would be; the recorded source is "-". An http(s) URL whose
  // server serves no byte ranges is staged there too.
  Result<ImageCopyRecord> Add(const std::string& name, const std::string& source,
                              const std::string& expected_sha512, const std::string& disk,
                              const pipeline::ReplicateOptions& options, const UploadSpec& upload = {});
  // Delivers `name` to every disk in `disks` that lacks a ready copy, from
  // ready copies (copies that become ready send too). Each send checks the
  // image's SHA-512. A disk whose file for the copy is another image's
  // copy is marked failed, saying so. Holds the image's lock throughout: kBusy, retryable
  // ("an image sync of NAME is already running"), at once when
  // another process (or another call in this one) syncs or adds `name`.
  // Recovers the image's interrupted rows first, so they are sent again.
  // Without a ready copy: an image whose origin is an http(s):// URL is
  // downloaded again from it (with options.origin_http) to the first disk
  // that lacks it, checked against the image's SHA-512 (else its expected
  // one), and sent on from there; SyncResult::downloaded_from says so. A
  // failed download is the error, naming the URL (kNotFound for a 404),
  // with the disks marked failed. Any other origin: kNotFound.
  // Once options.replicate.copy.cancel is
  // set no new send starts; the disks not sent to are marked failed.
  Result<SyncResult> Sync(const std::string& name, const std::vector<std::string>& disks,
                          const SyncOptions& options);
  // Marks failed (kInterruptedMessage) every pending or in-progress copy of
  // `name` (every image when "") whose owner is gone (OwnerIsGone), and
  // removes the stale temporary files (".NAME.barge-tmp") of the copy and of
  // its checksum record. An image whose lock another add or sync holds is
  // skipped: that process recovered its rows when it started, and the rows
  // now pending or in progress are its own. Rows of a live process are never
  // touched. Returns the rows it marked (their state before).
  Result<std::vector<ImageCopyRecord>> RecoverInterrupted(const std::string& name = "");
  // Every image, or one.
  Result<std::vector<ImageRecord>> Images(const std::string& name = "");
  Result<std::vector<ImageCopyRecord>> Copies(const std::string& name = "");
  Result<std::vector<SenderRecord>> Senders(const std::string& name = "");
  // Why the last add of `name` failed; nullopt when none failed since the
  // last add that succeeded.
  Result<std::optional<FailedAddRecord>> FailedAdd(const std::string& name);
  // Rebuilds the copies of `disks` (all known disks when empty) from their
  // checksum records: a file whose record matches is ready, one that does
  // not is failed; rows without a file are dropped. Recovers interrupted
  // rows first; pending and in-progress rows of a live process are kept
  // as they are.
  Status Rescan(const std::vector<std::string>& disks);
  // Removes ready copies that no qcow2 in their disk's folder uses as its
  // backing file and that have been unused for at least `unused_for`
  // (measured from when a cleanup first saw them unused, or their last
  // update). A copy in use is never removed, nor one whose image an add or
  // sync (another process included) is working on: removal holds the
  // image's lock, so a sync never loses the copy it sends from. Nor is the
  // last ready copy of an image ever removed (unused or not, the image
  // would be gone). dry_run: report what would be removed; change nothing
  // (not even the "unused since" times).
  Result<CleanupResult> Cleanup(std::chrono::seconds unused_for, bool dry_run = false);
  // The image's lock file (CatalogLockPath's kImage), the one add, sync,
  // cleanup and `backup --base image:NAME` hold.
  std::string LockPath(const std::string& name) const;

 private:
  ImageCatalog(Env& env, std::unique_ptr<SqliteDb> db, std::string catalog_path);
  // One Sync's steps and state (image_catalog.cc).
  struct SyncRun;
  // The key of a disk folder: its canonical path.
  std::string DiskKey(const std::string& disk);
  // The copy's state after a send, written by a send thread.
  Status RecordCopy(const ImageCopyRecord& copy);
  // RecoverInterrupted, where the caller already holds the lock of image
  // `held` ("" for none).
  Result<std::vector<ImageCopyRecord>> Recover(const std::string& name, const std::string& held);
  // A replicate progress callback that records the copy's percent at most
  // once a second (and at the end).
  std::function<void(size_t, uint64_t, uint64_t)> PercentRecorder(const ImageCopyRecord& copy);

  Env& env_;
  std::mutex mu_;
  std::unique_ptr<SqliteDb> db_;  // guarded by mu_
  const std::string catalog_path_;  // the database file; locks go beside it
};

}  // namespace barge::orchestrate
