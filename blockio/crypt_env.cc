// Encrypted chains in buckets (blockio/crypt_env.h).
#include "blockio/crypt_env.h"

#include <vector>

#include "blockio/aead_stream.h"
#include "blockio/bucket_env.h"
#include "blockio/s3_client.h"

namespace barge {

namespace {

constexpr std::string_view kMergeStagedSuffix = ".merge-new";  // pipeline/merge_journal.cc's

std::string BaseName(std::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string FolderPath(const S3Location& at) { return "s3://" + at.bucket + (at.key.empty() ? "" : "/" + at.key); }

bool IsMarker(const std::string& path) { return BaseName(path) == kEncryptionMarkerName; }

// Whether `path` lies in folder `dir` (both s3://, normalized here).
bool Under(const std::string& path, const std::string& dir) {
  auto p = BucketPathLocation(path);
  auto d = BucketPathLocation(dir);
  if (!p.ok() || !d.ok() || p->bucket != d->bucket) return false;
  return d->key.empty() || p->key == d->key || p->key.starts_with(d->key + "/");
}

// An EncryptingSink that owns the staged sink it writes.
class OwningEncryptingSink final : public BlockSink {
 public:
  OwningEncryptingSink(std::unique_ptr<BlockSink> inner, std::unique_ptr<EncryptingSink> sink)
      : inner_(std::move(inner)), sink_(std::move(sink)) {}
  const std::string& name() const override { return inner_->name(); }
  uint64_t size_bytes() const override { return sink_->size_bytes(); }
  SinkCapabilities capabilities() const override { return sink_->capabilities(); }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override { return sink_->WriteAt(offset, data); }
  Status Flush() override { return sink_->Flush(); }

 private:
  const std::unique_ptr<BlockSink> inner_;
  const std::unique_ptr<EncryptingSink> sink_;
};

}  // namespace

Result<std::string> EncryptedObjectIdentity(std::string_view path) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  std::string key = at.key;
  if (std::string final_key = BucketFinalKeyOfTemp(key); !final_key.empty()) key = final_key;
  const size_t slash = key.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const std::string_view name = std::string_view(key).substr(base);
  if (name.size() > kMergeStagedSuffix.size() + 1 && name[0] == '.' && name.ends_with(kMergeStagedSuffix)) {
    key = key.substr(0, base) + std::string(name.substr(1, name.size() - 1 - kMergeStagedSuffix.size()));
  }
  return at.bucket + "/" + key;
}

void CryptEnv::SetKey(std::optional<EncryptionKey> key, const std::string* new_root) {
  std::lock_guard lock(mu_);
  key_ = std::move(key);
  new_root_ = new_root;
  for (auto& [dir, root] : roots_) {
    if (root) root->have_check = false;
  }
}

Result<std::shared_ptr<CryptEnv::Root>> CryptEnv::RootOf(const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, BucketPathLocation(path));
  S3Location dir = at;
  while (!dir.key.empty()) {
    const size_t slash = dir.key.rfind('/');
    dir.key = slash == std::string::npos ? "" : dir.key.substr(0, slash);
    const std::string folder = FolderPath(dir);
    {
      std::lock_guard lock(mu_);
      if (auto it = roots_.find(folder); it != roots_.end()) {
        if (it->second) return it->second;
        continue;
      }
    }
    const std::string marker = folder + "/" + std::string(kEncryptionMarkerName);
    // A Stat first: in a folder just listed it costs no request, elsewhere
    // one short listing, where opening a missing object costs two (HEAD of
    // the object, then of the bucket).
    auto st = target().Stat(marker);
    if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return std::move(st).error();
    auto source = st.ok() ? target().OpenSource(marker, FileOptions{})
                          : Result<std::unique_ptr<BlockSource>>(std::move(st).error());
    std::shared_ptr<Root> root;
    if (source.ok()) {
      std::array<std::byte, kAeadHeaderBytes> bytes{};
      if ((*source)->size_bytes() < bytes.size()) {
        return Error::Corruption("not a barge encrypted object (the chain's encryption marker)").set_path(marker);
      }
      BARGE_RETURN_IF_ERROR((*source)->ReadAt(0, bytes));
      auto header = ParseAeadHeader(bytes);
      if (!header.ok()) return std::move(header).error().set_path(marker);
      root = std::make_shared<Root>();
      root->dir = folder;
      root->key_id = KeyIdHex(header->key_id);
    } else if (source.error().code() != ErrorCode::kNotFound) {
      return std::move(source).error();
    }
    std::lock_guard lock(mu_);
    auto [it, added] = roots_.emplace(folder, root);
    if (it->second) return it->second;
  }
  return std::shared_ptr<Root>();
}

Result<std::shared_ptr<CryptEnv::Root>> CryptEnv::CheckedRoot(const std::string& path, bool writing) {
  BARGE_ASSIGN_OR_RETURN(std::shared_ptr<Root> root, RootOf(path));
  std::optional<EncryptionKey> key;
  std::string new_root;
  {
    std::lock_guard lock(mu_);
    key = key_;
    if (new_root_ != nullptr) new_root = *new_root_;
  }
  if (!root) {
    if (!key) return root;
    // A chain that starts here: its marker is made with the first write,
    // and nothing plain is read before it.
    if (!new_root.empty() && Under(path, new_root)) {
      if (!writing) return root;
      BARGE_ASSIGN_OR_RETURN(S3Location dir, BucketPathLocation(new_root));
      return CreateRoot(FolderPath(dir));
    }
    return Error::InvalidArgument(
               "not an encrypted chain (no " + std::string(kEncryptionMarkerName) +
               " object above it): drop --encryption-key-file/--encryption-passphrase-file, or give the "
               "encrypted chain's location")
        .set_path(path);
  }
  if (!key) {
    return Error::InvalidArgument("the chain is encrypted (" + root->dir + "/" + std::string(kEncryptionMarkerName) +
                                  " names key " + root->key_id +
                                  "): give its --encryption-key-file or --encryption-passphrase-file")
        .set_path(path);
  }
  {
    std::lock_guard lock(mu_);
    if (root->have_check) {
      if (!root->checked.ok()) return root->checked.error();
      return root;
    }
  }
  // The key against the marker: a wrong key is one error here, before any
  // object is opened.
  const std::string marker = root->dir + "/" + std::string(kEncryptionMarkerName);
  Status checked = [&]() -> Status {
    BARGE_ASSIGN_OR_RETURN(std::string identity, EncryptedObjectIdentity(marker));
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> object, target().OpenSource(marker, FileOptions{}));
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<DecryptingSource> plain,
                           DecryptingSource::Open(std::move(object), *key, identity));
    std::string text(plain->size_bytes() <= 4096 ? plain->size_bytes() : 0, '\0');
    BARGE_RETURN_IF_ERROR(plain->ReadAt(0, std::as_writable_bytes(std::span(text))));
    if (text != kEncryptionMarkerText) return Error::Corruption("not barge's encryption marker").set_path(marker);
    return OkStatus();
  }();
  std::lock_guard lock(mu_);
  root->checked = checked;
  root->have_check = true;
  if (!checked.ok()) return checked.error();
  return root;
}

Result<std::shared_ptr<CryptEnv::Root>> CryptEnv::CreateRoot(const std::string& dir) {
  // A root that holds plaintext points stays plain: a chain is encrypted
  // from its first point or not at all.
  std::vector<std::string> folders{dir};
  for (size_t i = 0; i < folders.size() && i < 64; ++i) {
    auto names = target().ListDir(folders[i]);
    if (!names.ok() && names.error().code() == ErrorCode::kNotFound) continue;
    if (!names.ok()) return std::move(names).error();
    for (const std::string& name : *names) {
      const std::string path = folders[i] + "/" + name;
      if (name.ends_with(".qcow2") && !IsTempName(name)) {
        return Error::InvalidArgument("holds plaintext backups (" + path +
                                      "): a chain is encrypted from its first point; back up into a new --target")
            .set_path(dir);
      }
      if (folders[i] == dir && !IsTempName(name)) {
        auto st = target().Stat(path);
        if (st.ok() && st->type == FileStat::Type::kDirectory) folders.push_back(path);
      }
    }
  }
  std::optional<EncryptionKey> key;
  {
    std::lock_guard lock(mu_);
    key = key_;
  }
  const std::string marker = dir + "/" + std::string(kEncryptionMarkerName);
  const std::string temp = TempPathFor(marker);
  {
    BARGE_ASSIGN_OR_RETURN(std::string identity, EncryptedObjectIdentity(marker));
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> staged, target().OpenSink(temp, SinkMode::kTruncate, FileOptions{}));
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<EncryptingSink> sink, EncryptingSink::Create(*staged, *key, identity));
    BARGE_RETURN_IF_ERROR(sink->WriteAt(0, std::as_bytes(std::span(kEncryptionMarkerText))));
    BARGE_RETURN_IF_ERROR(sink->Flush());
  }
  // The conditional create: of two first runs, one marker wins and the
  // other run checks its key against it.
  Status linked = target().Link(temp, marker);
  if (!linked.ok() && linked.error().code() != ErrorCode::kBusy) return linked.error();
  {
    std::lock_guard lock(mu_);
    for (auto it = roots_.begin(); it != roots_.end();) {
      it = it->second ? std::next(it) : roots_.erase(it);
    }
  }
  return CheckedRoot(marker, false);
}

Result<std::unique_ptr<BlockSource>> CryptEnv::OpenSource(const std::string& path, const FileOptions& options) {
  if (!IsS3Url(path) || IsMarker(path)) return target().OpenSource(path, options);
  BARGE_ASSIGN_OR_RETURN(std::shared_ptr<Root> root, CheckedRoot(path, false));
  if (!root) return target().OpenSource(path, options);
  BARGE_ASSIGN_OR_RETURN(std::string identity, EncryptedObjectIdentity(path));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> object, target().OpenSource(path, options));
  std::optional<EncryptionKey> key;
  {
    std::lock_guard lock(mu_);
    key = key_;
  }
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<DecryptingSource> plain,
                         DecryptingSource::Open(std::move(object), *key, std::move(identity)));
  return std::unique_ptr<BlockSource>(std::move(plain));
}

Result<std::unique_ptr<BlockSink>> CryptEnv::OpenSink(const std::string& path, SinkMode mode,
                                                      const FileOptions& options) {
  if (!IsS3Url(path) || IsMarker(path)) return target().OpenSink(path, mode, options);
  BARGE_ASSIGN_OR_RETURN(std::shared_ptr<Root> root, CheckedRoot(path, true));
  if (!root) return target().OpenSink(path, mode, options);
  if (mode != SinkMode::kTruncate) {
    return Error::NotSupported("an encrypted object is not resumed: it is written again from its start").set_path(path);
  }
  BARGE_ASSIGN_OR_RETURN(std::string identity, EncryptedObjectIdentity(path));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> staged, target().OpenSink(path, mode, options));
  std::optional<EncryptionKey> key;
  {
    std::lock_guard lock(mu_);
    key = key_;
  }
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<EncryptingSink> sink,
                         EncryptingSink::Create(*staged, *key, std::move(identity)));
  return std::unique_ptr<BlockSink>(new OwningEncryptingSink(std::move(staged), std::move(sink)));
}

Result<FileStat> CryptEnv::Stat(const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(FileStat st, target().Stat(path));
  if (!IsS3Url(path) || IsMarker(path) || st.type != FileStat::Type::kRegular || IsTempName(BaseName(path))) {
    return st;
  }
  {
    std::lock_guard lock(mu_);
    if (!key_) return st;
  }
  BARGE_ASSIGN_OR_RETURN(std::shared_ptr<Root> root, RootOf(path));
  if (!root) return st;
  // The plaintext size: what OpenSource's source will say.
  if (auto plain = AeadLayout{}.PlaintextBytes(st.size_bytes); plain.ok()) st.size_bytes = *plain;
  return st;
}

}  // namespace barge
