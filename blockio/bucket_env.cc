// BucketEnv and RoutingEnv (blockio/bucket_env.h).
#include "blockio/bucket_env.h"

#include <unistd.h>

#include <ctime>
#include <random>
#include <thread>

#include "blockio/path.h"
#include "blockio/s3_lock.h"
#include "blockio/s3_source.h"
#include "blockio/s3_upload.h"

namespace barge {

namespace {

std::mutex g_notice_mu;
std::function<void(const std::string&)> g_notice;  // guarded by g_notice_mu

void BucketNotice(const std::string& line) {
  std::lock_guard lock(g_notice_mu);
  if (g_notice) g_notice(line);
}

}  // namespace

void SetBucketNoticeHandler(std::function<void(const std::string& line)> handler) {
  std::lock_guard lock(g_notice_mu);
  g_notice = std::move(handler);
}

Result<S3Location> BucketPathLocation(std::string_view path) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, ParseS3Url(path));
  std::string key;
  size_t i = 0;
  while (i <= at.key.size()) {
    size_t slash = at.key.find('/', i);
    if (slash == std::string::npos) slash = at.key.size();
    std::string_view part(at.key.data() + i, slash - i);
    if (part == "..") {
      return Error::InvalidArgument("a bucket path has no \"..\"").set_path(std::string(path));
    }
    if (!part.empty() && part != ".") {
      if (!key.empty()) key += '/';
      key += part;
    }
    i = slash + 1;
  }
  at.key = std::move(key);
  return at;
}

std::string BucketFolderPrefix(std::string_view key) { return key.empty() ? std::string() : std::string(key) + "/"; }

std::string BucketFinalKeyOfTemp(std::string_view key) {
  const size_t slash = key.find_last_of('/');
  const std::string_view dir = slash == std::string_view::npos ? std::string_view() : key.substr(0, slash + 1);
  const std::string_view name = slash == std::string_view::npos ? key : key.substr(slash + 1);
  if (!IsTempName(name)) return {};
  return std::string(dir) + std::string(name.substr(1, name.size() - 1 - std::string_view(".barge-tmp").size()));
}

namespace {

bool IsTempKey(std::string_view key) { return !BucketFinalKeyOfTemp(key).empty(); }

std::string PathOf(const S3Location& at) { return "s3://" + at.bucket + (at.key.empty() ? "" : "/" + at.key); }

// Last-Modified ("Sun, 29 Nov 2026 11:41:02 GMT") in nanoseconds; 0 when
// unreadable.
int64_t HttpDateNs(const std::string& text) {
  std::tm tm{};
  if (::strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S", &tm) == nullptr) return 0;
  return static_cast<int64_t>(::timegm(&tm)) * 1000000000;
}

// A listing's LastModified ("2026-11-29T11:41:02.000Z") in nanoseconds,
// whole seconds as a HEAD's Last-Modified gives; 0 when unreadable.
int64_t IsoDateNs(const std::string& text) {
  std::tm tm{};
  if (::strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return 0;
  return static_cast<int64_t>(::timegm(&tm)) * 1000000000;
}

// Device and inode (what tells two names of one file apart, and a
// backing chain that loops): the object's path, hashed, on a device of
// its own.
void Identify(FileStat& st, const S3Location& at) {
  st.device = 0x5333;  // "S3"
  st.inode = std::hash<std::string>{}(PathOf(at));
}

FileStat Regular(const S3Location& at, uint64_t size, int64_t mtime_ns) {
  FileStat st;
  Identify(st, at);
  st.type = FileStat::Type::kRegular;
  st.size_bytes = size;
  st.mtime_ns = mtime_ns;
  st.mode = 0600;  // private to the account
  st.uid = ::geteuid();
  st.gid = ::getegid();
  return st;
}

FileStat Folder(const S3Location& at) {
  FileStat st;
  Identify(st, at);
  st.type = FileStat::Type::kDirectory;
  st.mode = 0700;
  st.uid = ::geteuid();
  st.gid = ::getegid();
  return st;
}

// The folder path and name of a non-empty key: "s3://b/d", "x" for "d/x".
std::pair<std::string, std::string> SplitKey(const S3Location& at) {
  const size_t slash = at.key.find_last_of('/');
  if (slash == std::string::npos) return {PathOf(S3Location{at.bucket, ""}), at.key};
  return {PathOf(S3Location{at.bucket, at.key.substr(0, slash)}), at.key.substr(slash + 1)};
}

// A lock with nothing to release, or a callback on release.
class BucketLock : public EnvLock {
 public:
  BucketLock(std::string path, std::function<void()> release, std::unique_ptr<S3Lock> object = nullptr)
      : path_(std::move(path)), release_(std::move(release)), object_(std::move(object)) {}
  ~BucketLock() override {
    object_.reset();
    if (release_) release_();
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  std::function<void()> release_;
  std::unique_ptr<S3Lock> object_;
};

}  // namespace

// One staged temporary: the upload of its final key, shared by the sink
// (which StagedFile destroys before it publishes) and the Env's map.
struct BucketEnv::Staged {
  std::mutex mu;
  std::unique_ptr<S3Upload> upload;  // guarded by mu
  S3Location final_at;
  std::atomic<uint64_t> size{0};
  bool published = false;  // guarded by mu
};

namespace {

// The sink a staged temporary is written through: forwards to the upload.
class StagedSink : public BlockSink {
 public:
  StagedSink(std::shared_ptr<BucketEnv::Staged> staged, std::string name)
      : staged_(std::move(staged)), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return staged_->size.load(); }
  SinkCapabilities capabilities() const override { return staged_->upload->capabilities(); }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    BARGE_RETURN_IF_ERROR(staged_->upload->WriteAt(offset, data));
    Grow(offset + data.size());
    return OkStatus();
  }
  Status WriteZeroes(uint64_t offset, uint64_t length) override {
    BARGE_RETURN_IF_ERROR(staged_->upload->WriteZeroes(offset, length));
    Grow(offset + length);
    return OkStatus();
  }
  Status Flush() override { return staged_->upload->Flush(); }
  Status Truncate(uint64_t size_bytes) override {
    BARGE_RETURN_IF_ERROR(staged_->upload->Truncate(size_bytes));
    staged_->size.store(size_bytes);
    return OkStatus();
  }

 private:
  void Grow(uint64_t end) {
    uint64_t seen = staged_->size.load();
    while (end > seen && !staged_->size.compare_exchange_weak(seen, end)) {
    }
  }
  std::shared_ptr<BucketEnv::Staged> staged_;
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<BucketEnv>> BucketEnv::Create(HttpOptions http) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(http));
  return std::unique_ptr<BucketEnv>(new BucketEnv(std::move(http), std::move(client)));
}

BucketEnv::BucketEnv(HttpOptions http, std::unique_ptr<S3Client> client)
    : http_(std::move(http)), client_(std::move(client)) {}

BucketEnv::~BucketEnv() = default;

std::shared_ptr<BucketEnv::Staged> BucketEnv::FindStaged(const std::string& path) {
  std::lock_guard lock(mu_);
  auto it = staged_.find(path);
  return it == staged_.end() ? nullptr : it->second;
}

Result<std::unique_ptr<BlockSource>> BucketEnv::OpenSource(const std::string& path, const FileOptions&) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  if (IsTempKey(at.key)) return Error::NotFound("an unfinished upload is not readable").set_path(path);
  Listed listed;
  if (FromListing(at, &listed) == 1 && listed.stat.type == FileStat::Type::kRegular && !listed.etag.empty()) {
    // Known from the listing: no HEAD. The ETag still guards every read.
    BARGE_ASSIGN_OR_RETURN(HttpSourceOpened opened,
                           OpenS3SourceKnown(PathOf(at), http_, listed.stat.size_bytes, listed.etag));
    return std::move(opened.source);
  }
  BARGE_ASSIGN_OR_RETURN(HttpSourceOpened opened, OpenS3Source(PathOf(at), http_));
  return std::move(opened.source);
}

Result<std::unique_ptr<BlockSink>> BucketEnv::OpenSink(const std::string& path, SinkMode mode, const FileOptions&) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  const std::string final_key = BucketFinalKeyOfTemp(at.key);
  if (final_key.empty()) {
    return Error::NotSupported("objects in a bucket are written whole, under a staged name").set_path(path);
  }
  if (mode != SinkMode::kTruncate) {
    return Error::NotSupported("an unfinished upload in a bucket is not resumed yet").set_path(path);
  }
  auto staged = std::make_shared<Staged>();
  staged->final_at = S3Location{at.bucket, final_key};
  S3UploadOptions upload;
  {
    std::lock_guard lock(mu_);
    upload.retention = retention_;
  }
  BARGE_ASSIGN_OR_RETURN(staged->upload, S3Upload::Start(*client_, staged->final_at, upload));
  std::shared_ptr<Staged> replaced;
  {
    std::lock_guard lock(mu_);
    replaced = std::exchange(staged_[PathOf(at)], staged);
  }
  if (replaced) {
    std::lock_guard lock(replaced->mu);
    if (!replaced->published) IgnoreError(replaced->upload->Abort(), "the replaced upload is aborted at the next sweep");
  }
  return std::unique_ptr<BlockSink>(new StagedSink(std::move(staged), PathOf(at)));
}

Result<FileStat> BucketEnv::Stat(const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  if (at.key.empty()) {
    if (KnownFolder(PathOf(at))) return Folder(at);
    auto head = client_->Head(at);
    if (head.ok() || head.error().code() == ErrorCode::kIoError) {  // HEAD of a bucket: no length
      if (head.ok()) SawFolder(PathOf(at));
      return Folder(at);
    }
    if (head.error().code() == ErrorCode::kNotFound) {
      return Error::NotFound("the bucket " + at.bucket + " does not exist").set_path(path);
    }
    return head.error();
  }
  if (IsTempKey(at.key)) {
    // Only this process's uploads are files; another run's unfinished
    // upload is not (the sweep finds it through ListDir).
    if (auto staged = FindStaged(PathOf(at))) return Regular(at, staged->size.load(), 0);
    return Error::NotFound("no such file").set_path(path);
  }
  Listed listed;
  switch (FromListing(at, &listed)) {
    case 1:
      return listed.stat;
    case 0:
      return Error::NotFound("no such file").set_path(path);
    default:
      break;
  }
  if (KnownFolder(PathOf(at))) return Folder(at);
  // One short LIST of the keys that start with the name answers most
  // names: the object itself (it sorts first), a folder's keys ("KEY/..."),
  // or, in a page not filled, neither. A HEAD would cost a second request
  // (a HEAD of the bucket) for every missing name, and a third (the
  // folder's LIST). Only a page filled with other names ("KEY-old",
  // "KEY.json"...) falls back to the HEAD.
  BARGE_ASSIGN_OR_RETURN(auto near, client_->List(at, kStatProbeKeys, kStatProbeKeys));
  const std::string inside = BucketFolderPrefix(at.key);
  for (const auto& o : near) {
    if (o.key == at.key) return Regular(at, o.size, IsoDateNs(o.last_modified));
    if (o.key.starts_with(inside)) {
      SawFolder(PathOf(at));
      return Folder(at);
    }
  }
  if (near.size() < static_cast<size_t>(kStatProbeKeys)) {
    return Error::NotFound("no such object in bucket " + at.bucket).set_path(path);
  }
  auto head = client_->Head(at);
  if (head.ok()) return Regular(at, head->size, HttpDateNs(head->last_modified));
  if (head.error().code() != ErrorCode::kNotFound) return head.error();
  BARGE_ASSIGN_OR_RETURN(auto keys, client_->List(S3Location{at.bucket, inside}, 1, 1));
  if (!keys.empty()) {
    SawFolder(PathOf(at));
    return Folder(at);
  }
  return head.error();
}

Result<std::vector<std::string>> BucketEnv::ListDir(const std::string& dir) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(dir));
  const std::string prefix = BucketFolderPrefix(at.key);
  std::set<std::string> names;
  std::vector<std::string> uploads_seen;  // final names with unfinished uploads
  if (FreshListing(PathOf(at), &names, &uploads_seen)) {
    // Listed under kListingTtl ago, nothing changed through this Env since.
    for (const auto& rest : uploads_seen) {
      std::string temp = "." + rest + ".barge-tmp";
      if (FindStaged(JoinPath(PathOf(at), temp)) == nullptr) names.insert(std::move(temp));
    }
    return std::vector<std::string>(names.begin(), names.end());
  }
  BARGE_ASSIGN_OR_RETURN(auto objects, client_->List(S3Location{at.bucket, prefix}));
  if (objects.empty()) {
    auto st = Stat(dir);  // kNotFound for a missing folder
    if (!st.ok()) return st.error();
  } else {
    SawFolder(PathOf(at));
  }
  Listing listing;
  listing.taken = std::chrono::steady_clock::now();
  for (const auto& o : objects) {
    std::string rest = o.key.substr(prefix.size());
    if (rest.empty()) continue;  // the folder's marker
    const size_t slash = rest.find('/');
    std::string name = rest.substr(0, slash);
    if (slash == std::string::npos) {
      // An object wins over a folder of the same name, as in Stat.
      listing.names[name] = Listed{Regular(S3Location{at.bucket, o.key}, o.size, IsoDateNs(o.last_modified)), o.etag};
    } else {
      listing.names.emplace(name, Listed{Folder(S3Location{at.bucket, prefix + name}), {}});
    }
    names.insert(std::move(name));
  }
  BARGE_ASSIGN_OR_RETURN(auto uploads, client_->ListMultipartUploads(S3Location{at.bucket, prefix}));
  for (const auto& u : uploads) {
    std::string rest = u.key.substr(std::min(prefix.size(), u.key.size()));
    if (rest.empty() || rest.find('/') != std::string::npos) continue;
    listing.uploads.push_back(rest);
    std::string temp = "." + rest + ".barge-tmp";
    if (FindStaged(JoinPath(PathOf(at), temp)) == nullptr) names.insert(std::move(temp));
  }
  {
    std::lock_guard lock(mu_);
    listings_[PathOf(at)] = std::move(listing);
  }
  return std::vector<std::string>(names.begin(), names.end());
}

bool BucketEnv::FreshListing(const std::string& folder, std::set<std::string>* names,
                             std::vector<std::string>* uploads) {
  std::lock_guard lock(mu_);
  auto it = listings_.find(folder);
  if (it == listings_.end() || std::chrono::steady_clock::now() - it->second.taken >= kListingTtl) return false;
  for (const auto& [name, listed] : it->second.names) names->insert(name);
  *uploads = it->second.uploads;
  return true;
}

int BucketEnv::FromListing(const S3Location& at, Listed* out) {
  if (at.key.empty()) return -1;
  auto [folder, name] = SplitKey(at);
  std::lock_guard lock(mu_);
  auto it = listings_.find(folder);
  if (it == listings_.end()) return -1;
  if (std::chrono::steady_clock::now() - it->second.taken >= kListingTtl) {
    listings_.erase(it);
    return -1;
  }
  auto found = it->second.names.find(name);
  if (found == it->second.names.end()) return 0;
  *out = found->second;
  return 1;
}

void BucketEnv::Forget() {
  std::lock_guard lock(mu_);
  listings_.clear();
  // A bucket is never removed by barge: only folders go.
  std::erase_if(folders_, [](const auto& f) { return f.first.find('/', 5) != std::string::npos; });
}

bool BucketEnv::KnownFolder(const std::string& path) {
  std::lock_guard lock(mu_);
  auto it = folders_.find(path);
  return it != folders_.end() && std::chrono::steady_clock::now() - it->second < kListingTtl;
}

void BucketEnv::SawFolder(const std::string& path) {
  std::lock_guard lock(mu_);
  folders_[path] = std::chrono::steady_clock::now();
}

Status BucketEnv::CreateDir(const std::string& dir, uint32_t) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(dir));
  if (at.key.empty()) {
    auto st = Stat(dir);
    return st.ok() ? OkStatus() : Status(st.error());
  }
  // A zero-byte marker "KEY/" (the console's convention): an empty folder exists.
  Forget();
  return client_->Put(S3Location{at.bucket, at.key + "/"}, {});
}

Result<std::string> BucketEnv::CreateTempDir(const std::string& parent, std::string_view prefix) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(parent));
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    std::string name(prefix);
    for (int i = 0; i < 6; ++i) name += kChars[random() % (sizeof(kChars) - 1)];
    const std::string key = BucketFolderPrefix(at.key) + name;
    Forget();
    Status made = client_->PutIfAbsent(S3Location{at.bucket, key + "/"}, {});
    if (made.ok()) return PathOf(S3Location{at.bucket, key});
    if (made.error().code() != ErrorCode::kBusy || attempt == 8) return made.error();
  }
}

Status BucketEnv::PublishStaged(const std::string& from, const std::string& to, bool if_absent) {
  BARGE_ASSIGN_OR_RETURN(S3Location src, BucketPathLocation(from));
  BARGE_ASSIGN_OR_RETURN(S3Location dst, BucketPathLocation(to));
  std::shared_ptr<Staged> staged = FindStaged(PathOf(src));
  if (staged == nullptr) return CopyCommitted(src, dst, if_absent);
  if (!(dst.bucket == staged->final_at.bucket && dst.key == staged->final_at.key)) {
    return Error::NotSupported("a staged upload is published only under its own name " +
                               staged->final_at.shown()).set_path(to);
  }
  std::lock_guard lock(staged->mu);
  if (staged->published) return Error::InvalidArgument("already published").set_path(to);
  Forget();
  Status s = staged->upload->Publish(if_absent);
  if (!s.ok()) {
    Error e = std::move(s).error();
    if (e.path().empty()) e.set_path(to);
    return e;
  }
  staged->published = true;
  return OkStatus();
}

Status BucketEnv::CopyCommitted(const S3Location& from, const S3Location& to, bool if_absent) {
  Forget();
  if (if_absent) {
    // Link never replaces (the chain's lock keeps other writers out
    // between this HEAD and the copy).
    auto there = client_->Head(to);
    if (there.ok()) return Error::Busy("already exists").set_path(PathOf(to));
    if (there.error().code() != ErrorCode::kNotFound) return there.error();
  }
  // Above 5 GiB (a merge's new full) the client copies in parts.
  BARGE_RETURN_IF_ERROR(client_->Copy(from, to));
  // Link keeps the first name, as link(2) does; Rename removes it.
  return if_absent ? OkStatus() : client_->Delete(from);
}

Status BucketEnv::Rename(const std::string& from, const std::string& to) {
  return PublishStaged(from, to, /*if_absent=*/false);
}

Status BucketEnv::Link(const std::string& from, const std::string& to) {
  return PublishStaged(from, to, /*if_absent=*/true);
}

Status BucketEnv::CreateSymlink(const std::string&, const std::string& path) {
  return Error::NotSupported("a bucket holds no symbolic links").set_path(path);
}

Result<std::string> BucketEnv::ReadLink(const std::string& path) {
  return Error::InvalidArgument("not a symbolic link (a bucket holds none)").set_path(path);
}

Result<std::vector<std::string>> BucketEnv::ForeignUploads(const S3Location& final_at) {
  BARGE_ASSIGN_OR_RETURN(auto uploads, client_->ListMultipartUploads(final_at));
  std::vector<std::string> ids;
  for (const auto& u : uploads) {
    if (u.key == final_at.key) ids.push_back(u.upload_id);
  }
  return ids;
}

Status BucketEnv::Unlink(const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  Forget();
  const std::string final_key = BucketFinalKeyOfTemp(at.key);
  if (!final_key.empty()) {
    std::shared_ptr<Staged> staged;
    {
      std::lock_guard lock(mu_);
      auto it = staged_.find(PathOf(at));
      if (it != staged_.end()) {
        staged = std::move(it->second);
        staged_.erase(it);
      }
    }
    if (staged != nullptr) {
      std::lock_guard lock(staged->mu);
      return staged->published ? OkStatus() : staged->upload->Abort();
    }
    // Another run's unfinished uploads of the final key (a killed backup's):
    // the sweep of stale temporaries removes them here.
    const S3Location final_at{at.bucket, final_key};
    BARGE_ASSIGN_OR_RETURN(std::vector<std::string> ids, ForeignUploads(final_at));
    if (ids.empty()) return Error::NotFound("no such file").set_path(path);
    for (const auto& id : ids) BARGE_RETURN_IF_ERROR(client_->AbortMultipart(final_at, id));
    return OkStatus();
  }
  {
    // A lock object this process holds goes when the lock is released.
    std::lock_guard lock(mu_);
    if (held_locks_.count(PathOf(at))) return OkStatus();
  }
  return client_->Delete(at);
}

Status BucketEnv::RemoveDir(const std::string& dir) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(dir));
  if (at.key.empty()) return Error::NotSupported("a bucket is not removed by barge").set_path(dir);
  const std::string prefix = BucketFolderPrefix(at.key);
  Forget();
  BARGE_ASSIGN_OR_RETURN(auto objects, client_->List(S3Location{at.bucket, prefix}));
  if (objects.empty()) return Error::NotFound("no such folder").set_path(dir);
  for (const auto& o : objects) {
    if (o.key != prefix) return Error::FromErrno(ENOTEMPTY, "remove folder", dir);
  }
  return client_->Delete(S3Location{at.bucket, prefix});
}

Result<SpaceInfo> BucketEnv::Space(const std::string& path) {
  BARGE_RETURN_IF_ERROR(BucketPathLocation(path));
  // The free-space rule does not apply to a bucket: no limit known.
  SpaceInfo info;
  info.free_bytes = info.total_bytes = uint64_t{1} << 62;
  return info;
}

Result<std::string> BucketEnv::RealPath(const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  return PathOf(at);
}

Result<std::unique_ptr<EnvLock>> BucketEnv::LockFile(const std::string& path, const LockOptions& options) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  const std::string name = PathOf(at);
  const std::string final_key = BucketFinalKeyOfTemp(at.key);
  if (!final_key.empty()) {
    // An unfinished upload is private to its writer: a lock in this process.
    if (!options.create && FindStaged(name) == nullptr) {
      BARGE_ASSIGN_OR_RETURN(std::vector<std::string> ids, ForeignUploads(S3Location{at.bucket, final_key}));
      if (ids.empty()) return Error::NotFound("no such file").set_path(path);
    }
    for (;;) {
      {
        std::lock_guard lock(mu_);
        if (local_locks_.insert(name).second) break;
      }
      if (!options.wait) return Error::Busy(options.busy_message).set_path(path);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::unique_ptr<EnvLock>(new BucketLock(name, [this, name] {
      std::lock_guard lock(mu_);
      local_locks_.erase(name);
    }));
  }
  S3LockOptions o;
  o.busy_message = options.busy_message;
  o.wait = options.wait;
  Forget();  // the lock object comes and goes
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<S3Lock> held, S3Lock::Acquire(*client_, at, o));
  if (held->took_over()) {
    BucketNotice("took over the lock " + name + " of " + held->previous_owner() +
                 (held->takeover_reason() == "dead" ? " (that process is gone from this machine: a killed run)"
                                                     : " (expired: not renewed in time)"));
  }
  {
    std::lock_guard lock(mu_);
    held_locks_.insert(name);
    listings_.clear();
  }
  return std::unique_ptr<EnvLock>(new BucketLock(
      name,
      [this, name] {
        std::lock_guard lock(mu_);
        held_locks_.erase(name);
        listings_.clear();
      },
      std::move(held)));
}

Result<std::unique_ptr<EnvLock>> BucketEnv::LockImage(const std::string& path, ImageAccess) {
  // No QEMU holds a bucket's object.
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  return std::unique_ptr<EnvLock>(new BucketLock(PathOf(at), nullptr));
}

Result<bool> BucketEnv::LockEnabled(const std::string& bucket) {
  {
    std::lock_guard lock(mu_);
    if (auto it = lock_enabled_.find(bucket); it != lock_enabled_.end()) return it->second;
  }
  BARGE_ASSIGN_OR_RETURN(bool enabled, client_->GetObjectLockEnabled(bucket));
  std::lock_guard lock(mu_);
  lock_enabled_[bucket] = enabled;
  return enabled;
}

namespace {

Error NoObjectLock(const std::string& bucket, const std::string& path) {
  return Error::InvalidArgument("bucket " + bucket +
                                " was not created with Object Lock; retention needs a bucket with it enabled "
                                "(aws s3api create-bucket --object-lock-enabled-for-bucket)")
      .set_path(path);
}

}  // namespace

Status BucketEnv::SetRetention(const std::string& path, std::optional<S3Retention> retention) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  if (retention) {
    auto enabled = LockEnabled(at.bucket);
    if (!enabled.ok()) return Error(enabled.error()).set_path(path);
    if (!*enabled) return NoObjectLock(at.bucket, path);
  }
  std::lock_guard lock(mu_);
  retention_ = retention;
  return OkStatus();
}

Result<std::optional<S3Retention>> BucketEnv::ActiveRetention(const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  BARGE_ASSIGN_OR_RETURN(bool enabled, LockEnabled(at.bucket));
  if (!enabled || at.key.empty()) return std::optional<S3Retention>();
  auto got = client_->GetRetention(at);
  if (!got.ok()) {
    if (got.error().code() == ErrorCode::kNotFound) return std::optional<S3Retention>();
    return got.error();
  }
  if (got->until_unix <= static_cast<int64_t>(::time(nullptr))) return std::optional<S3Retention>();
  return std::optional<S3Retention>(*got);
}

Status BucketEnv::ExtendRetention(const std::string& path, const S3Retention& retention) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  BARGE_ASSIGN_OR_RETURN(bool enabled, LockEnabled(at.bucket));
  if (!enabled) return NoObjectLock(at.bucket, path);
  BARGE_ASSIGN_OR_RETURN(std::optional<S3Retention> now, ActiveRetention(path));
  S3Retention wanted = retention;
  if (now) {
    if (now->until_unix >= retention.until_unix) return OkStatus();
    if (now->mode == S3LockMode::kCompliance) wanted.mode = S3LockMode::kCompliance;
  }
  return client_->PutRetention(at, wanted);
}

Result<BucketEnv*> BucketEnvFor(Env& env, const std::string& path) {
  if (!IsS3Url(path)) return nullptr;
  Env* at = &env;
  for (;;) {
    if (auto* bucket = dynamic_cast<BucketEnv*>(at)) return bucket;
    if (auto* routing = dynamic_cast<RoutingEnv*>(at)) return routing->Bucket(path);
    auto* wrapper = dynamic_cast<EnvWrapper*>(at);
    if (wrapper == nullptr) return nullptr;
    at = &wrapper->target();
  }
}

// ---- RoutingEnv ----

Result<Env*> RoutingEnv::For(const std::string& path) {
  if (!IsS3Url(path)) return &target();
  BARGE_ASSIGN_OR_RETURN(BucketEnv * bucket, Bucket(path));
  return bucket;
}

Result<BucketEnv*> RoutingEnv::Bucket(const std::string& path) {
  std::lock_guard lock(mu_);
  if (bucket_ == nullptr) {
    auto made = BucketEnv::Create(http_());
    if (!made.ok()) {
      Error e = std::move(made).error();
      if (e.path().empty()) e.set_path(path);
      return e;
    }
    bucket_ = std::move(made).value();
  }
  return bucket_.get();
}

Result<Env*> RoutingEnv::ForBoth(const std::string& a, const std::string& b) {
  if (IsS3Url(a) != IsS3Url(b)) {
    return Error::NotSupported("a file is not moved between a bucket and a folder").set_path(b);
  }
  return For(a);
}

#define BARGE_ROUTE(path, call)                    \
  do {                                             \
    BARGE_ASSIGN_OR_RETURN(Env * env, For(path));  \
    return env->call;                              \
  } while (0)

Result<std::unique_ptr<BlockSource>> RoutingEnv::OpenSource(const std::string& path, const FileOptions& options) {
  BARGE_ROUTE(path, OpenSource(path, options));
}
Result<std::unique_ptr<BlockSink>> RoutingEnv::OpenSink(const std::string& path, SinkMode mode,
                                                        const FileOptions& options) {
  BARGE_ROUTE(path, OpenSink(path, mode, options));
}
Result<FileStat> RoutingEnv::Stat(const std::string& path) { BARGE_ROUTE(path, Stat(path)); }
Result<FileStat> RoutingEnv::StatNoFollow(const std::string& path) { BARGE_ROUTE(path, StatNoFollow(path)); }
Result<std::vector<std::string>> RoutingEnv::ListDir(const std::string& dir) { BARGE_ROUTE(dir, ListDir(dir)); }
Status RoutingEnv::CreateDir(const std::string& dir, uint32_t mode) { BARGE_ROUTE(dir, CreateDir(dir, mode)); }
Result<std::string> RoutingEnv::CreateTempDir(const std::string& parent, std::string_view prefix) {
  BARGE_ROUTE(parent, CreateTempDir(parent, prefix));
}
Status RoutingEnv::Rename(const std::string& from, const std::string& to) {
  BARGE_ASSIGN_OR_RETURN(Env * env, ForBoth(from, to));
  return env->Rename(from, to);
}
Status RoutingEnv::Link(const std::string& from, const std::string& to) {
  BARGE_ASSIGN_OR_RETURN(Env * env, ForBoth(from, to));
  return env->Link(from, to);
}
Status RoutingEnv::CreateSymlink(const std::string& t, const std::string& path) {
  BARGE_ROUTE(path, CreateSymlink(t, path));
}
Result<std::string> RoutingEnv::ReadLink(const std::string& path) { BARGE_ROUTE(path, ReadLink(path)); }
Status RoutingEnv::Unlink(const std::string& path) { BARGE_ROUTE(path, Unlink(path)); }
Status RoutingEnv::RemoveDir(const std::string& dir) { BARGE_ROUTE(dir, RemoveDir(dir)); }
Status RoutingEnv::SyncDir(const std::string& dir) { BARGE_ROUTE(dir, SyncDir(dir)); }
Result<SpaceInfo> RoutingEnv::Space(const std::string& path) { BARGE_ROUTE(path, Space(path)); }
Status RoutingEnv::SetOwner(const std::string& path, uint32_t uid, uint32_t gid) {
  BARGE_ROUTE(path, SetOwner(path, uid, gid));
}
Status RoutingEnv::SetMode(const std::string& path, uint32_t mode) { BARGE_ROUTE(path, SetMode(path, mode)); }
Result<std::string> RoutingEnv::RealPath(const std::string& path) { BARGE_ROUTE(path, RealPath(path)); }
Result<std::unique_ptr<EnvLock>> RoutingEnv::LockFile(const std::string& path, const LockOptions& options) {
  BARGE_ROUTE(path, LockFile(path, options));
}
Result<std::unique_ptr<EnvLock>> RoutingEnv::LockImage(const std::string& path, ImageAccess access) {
  BARGE_ROUTE(path, LockImage(path, access));
}

#undef BARGE_ROUTE

}  // namespace barge
