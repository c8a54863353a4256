// A bucket as an Env (issue 38, DESIGN.md "Where chains live"): paths
// "s3://BUCKET/KEY..." map onto objects, so that every chain job (backup,
// list, verify, restore...) reaches a bucket through the same seam as a
// folder. The chain protocol's primitives become object operations
// (docs/s3.md, "A chain in a bucket"): a staged temporary ".NAME.barge-tmp"
// is a multipart upload of NAME, invisible until published; Link is the
// conditional create (If-None-Match: *) that commits; a folder is a
// prefix (with a zero-byte marker "KEY/"); LockFile of a lock file is a
// lock object (blockio/s3_lock.h). RoutingEnv sends s3:// paths to a
// BucketEnv and every other path to the local Env.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/http_client.h"
#include "blockio/s3_client.h"

namespace barge {

// The object location of an s3:// path: the key normalized (no "." or
// empty components, no trailing '/'; ".." refused, kInvalidArgument), so
// that "s3://b/x/" and "s3://b/x" name one folder. The bucket itself has
// the key "". ParseS3Url's errors otherwise.
Result<S3Location> BucketPathLocation(std::string_view path);
// The prefix of the keys inside folder `key`: "KEY/", or "" for the bucket.
std::string BucketFolderPrefix(std::string_view key);
// The final key a temporary's upload publishes: "d/.NAME.barge-tmp" ->
// "d/NAME"; "" when `key` is no temporary's name.
std::string BucketFinalKeyOfTemp(std::string_view key);

class BucketEnv : public Env {
 public:
  // `http` carries the endpoint, region and keys (http.s3); kInvalidArgument
  // as S3Client::Create says.
  static Result<std::unique_ptr<BucketEnv>> Create(HttpOptions http);
  ~BucketEnv() override;

  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path, const FileOptions& options) override;
  // Only a staged temporary (IsTempName) with kTruncate: a multipart upload
  // of its final name. kNotSupported otherwise.
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options) override;
  // A name in a folder listed less than kListingTtl ago (and not changed
  // through this Env since) is answered from that listing, with no request:
  // its size and Last-Modified, or NotFound. Otherwise one LIST of the keys
  // starting with the name (the object, a folder's keys, or neither); a
  // HEAD and a folder's LIST only when that page is filled with other
  // names.
  Result<FileStat> Stat(const std::string& path) override;
  Result<FileStat> StatNoFollow(const std::string& path) override { return Stat(path); }
  // Objects and sub-folders directly in `dir`, sorted, plus
  // ".NAME.barge-tmp" for each unfinished multipart upload of a key NAME
  // in it that this process does not write (a killed run's: the sweep of
  // stale temporaries aborts it through LockFile and Unlink). Remembers
  // the objects' sizes and ETags for Stat and OpenSource (the listing
  // cache, docs/s3.md), and the answer: a folder listed under kListingTtl
  // ago, nothing changed through this Env since, is listed again with no
  // request.
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;
  Status CreateDir(const std::string& dir, uint32_t mode) override;
  Result<std::string> CreateTempDir(const std::string& parent, std::string_view prefix) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Link(const std::string& from, const std::string& to) override;
  Status CreateSymlink(const std::string& target, const std::string& path) override;
  Result<std::string> ReadLink(const std::string& path) override;
  Status Unlink(const std::string& path) override;
  Status RemoveDir(const std::string& dir) override;
  Status SyncDir(const std::string&) override { return OkStatus(); }
  Result<SpaceInfo> Space(const std::string& path) override;
  // Objects are private to the account: nothing to do.
  Status SetOwner(const std::string&, uint32_t, uint32_t) override { return OkStatus(); }
  Status SetMode(const std::string&, uint32_t) override { return OkStatus(); }
  Result<std::string> RealPath(const std::string& path) override;
  Result<std::unique_ptr<EnvLock>> LockFile(const std::string& path, const LockOptions& options) override;
  Result<std::unique_ptr<EnvLock>> LockImage(const std::string& path, ImageAccess access) override;

  // --- Object Lock (issue 40, docs/s3.md "Immutable points") ---
  // From now on every object this Env publishes (a staged upload's Link or
  // Rename: a point's image, digest tables and manifest) carries
  // `retention`; nullopt: none (lock objects and folder markers never
  // do). kInvalidArgument naming `path` when its bucket was not created
  // with Object Lock: checked here, before anything is written.
  Status SetRetention(const std::string& path, std::optional<S3Retention> retention);
  // The retention of the object at `path` while it runs (until in the
  // future): nullopt when the object has none, it ran out, the object is
  // missing, or its bucket has no Object Lock (asked once per bucket).
  Result<std::optional<S3Retention>> ActiveRetention(const std::string& path);
  // Makes the object at `path` retained until at least
  // `retention.until_unix`: never shortened, and a COMPLIANCE object stays
  // COMPLIANCE (S3 refuses weakening it); an object with no retention gets
  // `retention`. The bucket-without-Object-Lock error as SetRetention.
  Status ExtendRetention(const std::string& path, const S3Retention& retention);

  // Implementation (bucket_env.cc).
  struct Staged;

 private:
  explicit BucketEnv(HttpOptions http, std::unique_ptr<S3Client> client);
  // The local upload staged at temporary `path`, or null.
  std::shared_ptr<Staged> FindStaged(const std::string& path);
  // Unfinished multipart uploads of exactly `final_key` (other runs').
  Result<std::vector<std::string>> ForeignUploads(const S3Location& final_at);
  Status PublishStaged(const std::string& from, const std::string& to, bool if_absent);
  // Rename/Link of a committed object (a merge's ".NAME.merge-new"): a
  // server-side copy to `to` (when if_absent, only if `to` is missing),
  // then, for a rename, a delete. Not atomic: the merge journal redoes an
  // interrupted rename. Over 5 GiB, a multipart copy (S3Client::Copy).
  Status CopyCommitted(const S3Location& from, const S3Location& to, bool if_absent);

  // The listing cache. Other writers exist (another host's run, a user's
  // aws s3 rm), so an entry lives kListingTtl only; what keeps a chain job
  // correct is the chain's lock, not the cache: every writer of a chain
  // folder holds it, and this Env's own changes (publish, copy, delete,
  // folder, lock) drop the cache at once. Object bytes are never cached.
  static constexpr std::chrono::milliseconds kListingTtl{2000};
  struct Listed {
    FileStat stat;
    std::string etag;  // objects only
  };
  struct Listing {
    std::chrono::steady_clock::time_point taken;
    std::map<std::string, Listed> names;  // directly inside, by name
    std::vector<std::string> uploads;     // names directly inside with unfinished uploads
  };
  // A folder's listing taken under kListingTtl ago: its names into *names,
  // the names with unfinished uploads into *uploads; false when none.
  bool FreshListing(const std::string& folder, std::set<std::string>* names, std::vector<std::string>* uploads);
  // Keys of the LIST that answers a Stat (Stat: the name, its folder's
  // keys, or neither).
  static constexpr int kStatProbeKeys = 16;
  // The fresh listing's answer for `at` (a key in a listed folder):
  // 1 found (*out set), 0 known absent, -1 unknown.
  int FromListing(const S3Location& at, Listed* out);
  // Drops every listing and every folder seen but the buckets (after any
  // change made through this Env).
  void Forget();
  // Whether folder (or bucket) `path` was seen to exist under kListingTtl
  // ago; SawFolder records it.
  bool KnownFolder(const std::string& path);
  void SawFolder(const std::string& path);
  // Whether `bucket` has Object Lock (asked once; remembered).
  Result<bool> LockEnabled(const std::string& bucket);

  const HttpOptions http_;
  const std::unique_ptr<S3Client> client_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Staged>> staged_;  // by temporary path; guarded by mu_
  std::set<std::string> local_locks_;                       // temporaries locked; guarded by mu_
  std::set<std::string> held_locks_;                        // lock objects held; guarded by mu_
  std::map<std::string, Listing> listings_;                 // by folder path; guarded by mu_
  std::map<std::string, std::chrono::steady_clock::time_point> folders_;  // seen, by path; guarded by mu_
  std::optional<S3Retention> retention_;                    // of new objects; guarded by mu_
  std::map<std::string, bool> lock_enabled_;                // by bucket; guarded by mu_
};

// The BucketEnv that `env` sends the s3:// path `path` to: `env` itself, a
// RoutingEnv's (made now if need be), or one below EnvWrappers; null for
// any other path or Env (nothing there can be locked). Errors: making the
// RoutingEnv's BucketEnv.
Result<BucketEnv*> BucketEnvFor(Env& env, const std::string& path);

// Where BucketEnvs tell what a user should know that is no error: one line
// (a dead run's lock object taken over, naming it and its owner). The cli
// sets it once, before any job; default: nowhere.
void SetBucketNoticeHandler(std::function<void(const std::string& line)> handler);

// s3:// paths to a BucketEnv made on first use from the options `http`
// gives then (endpoint, region and keys: the cli's, read at its edge); a
// failure to make it is every such call's error. Every other path goes to
// `local`.
class RoutingEnv : public EnvWrapper {
 public:
  RoutingEnv(Env& local, std::function<HttpOptions()> http) : EnvWrapper(local), http_(std::move(http)) {}

  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path, const FileOptions& options) override;
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options) override;
  Result<FileStat> Stat(const std::string& path) override;
  Result<FileStat> StatNoFollow(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;
  Status CreateDir(const std::string& dir, uint32_t mode) override;
  Result<std::string> CreateTempDir(const std::string& parent, std::string_view prefix) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Link(const std::string& from, const std::string& to) override;
  Status CreateSymlink(const std::string& target, const std::string& path) override;
  Result<std::string> ReadLink(const std::string& path) override;
  Status Unlink(const std::string& path) override;
  Status RemoveDir(const std::string& dir) override;
  Status SyncDir(const std::string& dir) override;
  Result<SpaceInfo> Space(const std::string& path) override;
  Status SetOwner(const std::string& path, uint32_t uid, uint32_t gid) override;
  Status SetMode(const std::string& path, uint32_t mode) override;
  Result<std::string> RealPath(const std::string& path) override;
  Result<std::unique_ptr<EnvLock>> LockFile(const std::string& path, const LockOptions& options) override;
  Result<std::unique_ptr<EnvLock>> LockImage(const std::string& path, ImageAccess access) override;

  // The BucketEnv of s3:// paths, made on first use.
  Result<BucketEnv*> Bucket(const std::string& path);

 private:
  // The Env for `path`: the bucket's (made now if needed) or the local one.
  Result<Env*> For(const std::string& path);
  // Both paths in one store; kNotSupported across stores.
  Result<Env*> ForBoth(const std::string& a, const std::string& b);

  const std::function<HttpOptions()> http_;
  std::mutex mu_;
  std::unique_ptr<BucketEnv> bucket_;  // guarded by mu_ until made
};

}  // namespace barge
