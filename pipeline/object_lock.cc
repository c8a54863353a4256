// Immutable points: retention checked and extended (pipeline/object_lock.h).
#include "pipeline/object_lock.h"

#include <set>

#include "blockio/bucket_env.h"
#include "blockio/path.h"
#include "pipeline/chain_files.h"

namespace barge::pipeline {

std::vector<std::string> PointFiles(const std::string& chain_dir, const formats::BackupManifest& m) {
  std::vector<std::string> files = {JoinPath(chain_dir, m.id + ".json")};
  for (const std::string* name : {&m.image, &m.digest_table, &m.strong_digest_table}) {
    if (!name->empty()) files.push_back(JoinPath(chain_dir, *name));
  }
  return files;
}

Status CheckNotLocked(Env& env, const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    BARGE_ASSIGN_OR_RETURN(BucketEnv * bucket, BucketEnvFor(env, path));
    if (bucket == nullptr) continue;
    BARGE_ASSIGN_OR_RETURN(std::optional<S3Retention> held, bucket->ActiveRetention(path));
    if (!held) continue;
    BARGE_ASSIGN_OR_RETURN(std::string shown, bucket->RealPath(path));
    return Error::InvalidArgument("locked until " + S3IsoTime(held->until_unix) + " (" +
                                  std::string(S3LockModeName(held->mode)) +
                                  ", S3 Object Lock): nothing was changed")
        .set_path(shown);
  }
  return OkStatus();
}

Status ExtendDependencies(Env& env, const std::string& chain_dir, const formats::BackupManifest& m,
                          const S3Retention& retention) {
  std::string dir = chain_dir;
  std::optional<std::string> next;  // the id of the next point to extend, in `dir`
  if (m.parent) next = m.parent->id;
  else if (m.base) {
    dir = LexicallyNormal(JoinPath(chain_dir, m.base->chain));
    next = m.base->id;
  }
  std::set<std::string> seen;  // a manifest naming its own descendant: stop, never loop
  while (next && seen.insert(dir + "|" + *next).second) {
    BARGE_ASSIGN_OR_RETURN(BucketEnv * bucket, BucketEnvFor(env, dir));
    if (bucket == nullptr) return OkStatus();  // a base chain outside the bucket holds no lock
    BARGE_ASSIGN_OR_RETURN(std::string text, ReadChainFile(env, JoinPath(dir, *next + ".json")));
    auto point = formats::DecodeManifest(text);
    if (!point.ok()) return Error(point.error()).set_path(JoinPath(dir, *next + ".json"));
    for (const std::string& file : PointFiles(dir, *point)) {
      BARGE_RETURN_IF_ERROR(bucket->ExtendRetention(file, retention));
    }
    next.reset();
    if (point->parent) next = point->parent->id;
    else if (point->base) {
      dir = LexicallyNormal(JoinPath(dir, point->base->chain));
      next = point->base->id;
    }
  }
  return OkStatus();
}

}  // namespace barge::pipeline
