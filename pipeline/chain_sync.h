// `barge sync SRC DST` (docs/sync.md): copies the points of a chain folder
// that another chain location lacks, oldest first, each one whole or not
// at all, written purely through the Env and the chain-folder protocol
// (pipeline/chain_folder.h), so that a location may be a folder or any
// other Env (a bucket) alike.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::pipeline {

// What happened to one point of SRC.
struct SyncedPoint {
  std::string id;
  bool copied = false;    // false: DST had it already (skipped)
  uint64_t bytes = 0;     // copied: the bytes of its files (image, digest
                          // tables, manifest)
  bool verified = false;  // copied: DST's copy passed the check (SyncChain)
  double seconds = 0;
};

struct SyncChainResult {
  std::string src, dst;             // the chain folders
  std::vector<SyncedPoint> points;  // SRC's points, oldest first
  uint64_t bytes_copied = 0;
  size_t copied = 0, skipped = 0;
  double seconds = 0;
};

struct SyncOptions {
  // Set true to stop (kCancelled) between chunks and points; may be null.
  const std::atomic<bool>* cancel = nullptr;
  // DST keeps its own retention (a policy's offsite copy,
  // docs/policies.md): a point of SRC that DST lacks and that is older
  // than DST's latest (DST forgot it) is skipped, not refused as diverged.
  bool newer_only = false;
  // Called after each point is copied (and verified) or skipped, in order.
  std::function<void(const SyncChainResult& chain, const SyncedPoint& point)> on_point;
};

// Copies every point of chain folder `src` that chain folder `dst` lacks,
// oldest first. For each one: SRC's point is verified first (the check
// `barge verify` does, RunVerify: structure, every cluster's digest, the
// image digest), so that damaged data is never copied (kCorruption, DST
// untouched); then its image is streamed front to back (bounded memory)
// into a staged file of DST, its digest tables and manifest staged after
// it, and all committed, the manifest last (ChainWriter); then DST's
// copy is checked before the next point: its manifest and digest tables
// read back equal to SRC's, its qcow2 structure, and every cluster its own
// image stores against the point's digests (the layers under it are DST's
// points checked when they were copied: the disk is not read again per
// point). DST's copy failing that check is kCorruption and its files are
// removed again, manifest first. A sync stopped at any moment leaves DST with whole points only;
// the next one resumes at the first point DST lacks.
// DST is made when missing, and held under its chain lock while written
// (kBusy at once when another job writes it). SRC is read without its
// lock, as restore and verify read (a backup may append to it meanwhile).
// Refused (kInvalidArgument, nothing written): DST holds another disk's
// chain (OtherDiskReason), or DST and SRC diverged: a point of one id but
// other contents in each (a merge in one of them), a point of DST's
// sequence number but another id, or a point SRC has that is older than
// DST's latest and DST lacks.
Result<SyncChainResult> SyncChain(Env& env, const std::string& src, const std::string& dst,
                                  const SyncOptions& options = {});

// Whether `dir` is a chain folder: it holds a manifest (*.json).
Result<bool> IsChainFolder(Env& env, const std::string& dir);

// The chains `src` names, as (src chain folder, dst chain folder) pairs:
// `src` itself (to `dst`) when it is a chain folder, else every chain
// folder directly under it, TARGET/NAME to DST/NAME: sorted by name, the
// chains over a base (`backup --base`) after those over none, so that a
// base chain of the target is copied before its clones (one level).
// kNotFound when `src` is missing or holds no chain.
Result<std::vector<std::pair<std::string, std::string>>> SyncPairs(Env& env, const std::string& src,
                                                                   const std::string& dst);

}  // namespace barge::pipeline

namespace barge::pipeline {

// The line `barge sync` prints for one point: "  copied 0001-... (12 MiB),
// verified" or "  skipped 0000-... (DST has it)".
std::string SyncPointText(const SyncedPoint& point);
// The line after a chain: "SRC -> DST: 2 points copied (12 MiB, verified),
// 1 skipped, in 1.2 s", or with none copied "SRC -> DST: nothing to copy
// (DST has all 3 points), in 0.4 s".
std::string SyncChainText(const SyncChainResult& chain);

}  // namespace barge::pipeline
