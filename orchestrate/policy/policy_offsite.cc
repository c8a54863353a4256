// A policy target's offsite copy (orchestrate/policy/policy_offsite.h).
#include "orchestrate/policy/policy_offsite.h"

#include "blockio/path.h"
#include "orchestrate/policy/policy_runner.h"
#include "pipeline/chain_sync.h"
#include "pipeline/file_access.h"

namespace barge::orchestrate {

std::string SourceChainsDir(const std::string& root, const Policy& policy, const PolicySource& source) {
  return root + "/" + policy.name + "/" + (source.kind == PolicySourceKind::kDomain ? source.location : source.name);
}

std::string OffsiteFailureText(const PolicyOffsite& offsite, const Error& error) {
  return "offsite " + offsite.location + ": " + error.ToString();
}

bool IsOffsiteFailure(const std::string& record_error) { return record_error.starts_with("offsite "); }

Result<std::string> SyncOffsite(Env& env, const Policy& policy, const PolicySource& source,
                                const PolicyOffsite& offsite, const pipeline::CopyOptions& copy) {
  const std::string src = SourceChainsDir(offsite.target, policy, source);
  const std::string dst = SourceChainsDir(offsite.location, policy, source);
  auto pairs = pipeline::SyncPairs(env, src, dst);
  if (!pairs.ok()) return pairs.error();
  // The offsite's policy folder, as a backup makes the target's (private).
  auto made = pipeline::CreateFolders(env, DirName(dst), pipeline::FileAccess::Private());
  if (!made.ok()) return made.error();
  pipeline::SyncOptions so;
  so.cancel = copy.cancel;
  so.newer_only = true;
  size_t copied = 0;
  size_t removed = 0;
  for (const auto& [from, to] : *pairs) {
    auto synced = pipeline::SyncChain(env, from, to, so);
    if (!synced.ok()) return synced.error();
    copied += synced->copied;
    ForgetPolicy keep;
    keep.keep_last = offsite.retention_count;
    ForgetOptions fo;
    fo.copy = copy;  // no catalog: the offsite's points are no run's record
    auto forgot = ForgetChainFolder(env, to, keep, fo);
    if (!forgot.ok()) return forgot.error();
    if (!forgot->error.empty()) {
      return Error::IoError("retention: " + forgot->error).set_path(to);
    }
    removed += forgot->plan.forget.size();
  }
  return std::to_string(copied) + " point(s) copied to " + offsite.location + ", verified; " +
         std::to_string(removed) + " removed there";
}

}  // namespace barge::orchestrate
