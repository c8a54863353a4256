// Immutable points (issue 40, section 3; docs/s3.md "Immutable points"): a
// point in a bucket with S3 Object Lock carries retention on each of its
// objects, and the points it depends on are retained at least as long, so
// that a chain is never half-deletable. Here: the chain-level rules on top
// of the BucketEnv's retention (blockio/bucket_env.h). Paths outside a
// bucket are never locked: every function is a no-op for them.
#pragma once

#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/s3_xml.h"
#include "formats/manifest.h"

namespace barge::pipeline {

// The files of point `m` in `chain_dir`: its manifest (ID.json), image,
// digest table and strong digest table (when it has one).
std::vector<std::string> PointFiles(const std::string& chain_dir, const formats::BackupManifest& m);

// Refuses, before anything changes, a job that would delete or replace one
// of `paths` while it is retained: kInvalidArgument naming the first such
// path, "locked until 2026-11-30T12:00:00Z (COMPLIANCE, S3 Object Lock):
// nothing was changed" (exit 1). Asks the store (one request per object in a bucket with Object Lock,
// one per bucket without); changes nothing.
Status CheckNotLocked(Env& env, const std::vector<std::string>& paths);

// Retains every object of the points that point `m` of `chain_dir` depends
// on until at least `retention.until_unix`: its parent, the parent's
// parent... up to the full, and a base chain's point (and what that one
// depends on). Never shortens; a COMPLIANCE object stays COMPLIANCE. The
// point's own objects are not touched (they were published with it). A
// chain outside a bucket: nothing to do. Errors: a manifest that cannot be
// read, the store's refusal (a bucket without Object Lock is
// kInvalidArgument naming it).
Status ExtendDependencies(Env& env, const std::string& chain_dir, const formats::BackupManifest& m,
                          const S3Retention& retention);

}  // namespace barge::pipeline
