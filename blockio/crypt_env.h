// Encryption at rest for chains in buckets (issue 40 §2,
// docs/formats/encryption.md "Chains in a bucket"): an Env decorator over
// the routing Env that writes every s3:// object barge stages (images,
// manifests, digest tables, journals) through an EncryptingSink and reads
// every s3:// object through a DecryptingSource, when the object lies in an
// encrypted chain root.
//
// An encrypted root is a folder holding the marker object
// "barge-encryption": itself an encrypted object (its header names the
// cipher, the key id and the KDF parameters and salt, never the key) whose
// plaintext is kEncryptionMarkerText. The first encrypted write under the
// writer's root (backup's --target) creates it; a root that already holds
// plaintext points is refused. Every later run checks its key against the
// marker before touching an object: a wrong key is one "wrong key" error,
// a run without a key is told the chain is encrypted (and writes nothing
// plaintext into it), a key given for a plain chain is refused.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "blockio/encryption_key.h"
#include "blockio/env.h"

namespace barge {

inline constexpr std::string_view kEncryptionMarkerName = "barge-encryption";
inline constexpr std::string_view kEncryptionMarkerText = "barge encrypted chain root v1\n";

// The identity an object is sealed under (the AAD of its segments):
// "BUCKET/KEY" of the name the object ends up with, so that the staged
// temporary ".NAME.barge-tmp" and a merge's ".NAME.merge-new" (published
// then copied to NAME) seal under NAME. InvalidArgument for a path that is
// not s3://.
Result<std::string> EncryptedObjectIdentity(std::string_view path);

// s3:// paths only; every other path goes to the target unchanged.
// Thread-safe.
class CryptEnv : public EnvWrapper {
 public:
  explicit CryptEnv(Env& target) : EnvWrapper(target) {}

  // The key of this run, or none. `new_root`: the folder where a chain may
  // start encrypted (backup's --target; "" for readers); read at the first
  // write, so it may be filled after this call (a flag parsed later).
  void SetKey(std::optional<EncryptionKey> key, const std::string* new_root);

  // An object under an encrypted root, opened through DecryptingSource
  // (the marker's check first). Errors: InvalidArgument "the chain is
  // encrypted ..." without a key, "wrong key ..." with another one, "is not
  // encrypted" for a key given on a plain chain; Corruption as
  // DecryptingSource::Open.
  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path, const FileOptions& options) override;
  // A staged object under an encrypted root (made now under new_root),
  // written through an EncryptingSink; the caller's Flush completes it
  // before the publish. Errors as OpenSource.
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options) override;
  // An encrypted object's plaintext size (when a key is given).
  Result<FileStat> Stat(const std::string& path) override;
  Result<FileStat> StatNoFollow(const std::string& path) override { return Stat(path); }

 private:
  struct Root {
    std::string dir;       // the folder holding the marker
    std::string key_id;    // hex, from the marker's header
    Status checked;        // the key's check against the marker (with a key)
    bool have_check = false;
  };
  // The encrypted root `path` lies in (the nearest folder above it with a
  // marker), or null. Cached per folder for the process.
  Result<std::shared_ptr<Root>> RootOf(const std::string& path);
  // The root of `path` checked against the key: null for a path in no
  // encrypted root with no key; errors as OpenSource.
  Result<std::shared_ptr<Root>> CheckedRoot(const std::string& path, bool writing);
  // Writes the marker into `dir` (refused when it holds plaintext points).
  Result<std::shared_ptr<Root>> CreateRoot(const std::string& dir);

  std::mutex mu_;
  std::optional<EncryptionKey> key_;                          // guarded by mu_
  const std::string* new_root_ = nullptr;                     // guarded by mu_
  std::map<std::string, std::shared_ptr<Root>> roots_;        // by folder; null: no marker; guarded by mu_
};

}  // namespace barge
