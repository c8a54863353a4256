// Moving a VM's persistent state folder (TPM/EFI files, CBT overlays with
// their bitmaps) to a new volume: copy, verify, mark the new copy current,
// then remove the old one, with a journal in the target so a re-run after a
// crash at any step finishes or rolls back, never losing both copies.
// docs/replication.md describes the journal.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::orchestrate {

// The journal's steps, in order; each is durable (fsync) before the next
// begins. The commit point is kCurrent: before it the old folder is the
// current one and recovery removes the new copy; from it on the new one is
// current and recovery finishes removing the old.
enum class MigrateStep : int {
  kNone = 0,
  kBegin = 1,       // target created, journal opened (from, to)
  kCopied = 2,      // every file copied and fsynced; sizes and SHA-512s listed
  kVerified = 3,    // every copy re-read and equal to the listed SHA-512
  kCurrent = 4,     // marker written in the target: the new copy is current
  kOldRemoved = 5,  // the old folder is gone
  kDone = 6,
};
std::string_view MigrateStepName(MigrateStep step);

// The journal file inside the target folder, and the marker saying a folder
// is the current copy of migrated state.
inline constexpr const char* kMigrateJournalName = ".barge-migrate.journal";
inline constexpr const char* kStateMarkerName = ".barge-state.json";

// One record of the journal, as read back.
struct MigrateJournalRecord {
  MigrateStep step = MigrateStep::kNone;
  std::string from;  // the first record's: the migration's folders
  std::string to;
};

// Parses the journal's text: one JSON object per line, in order. The
// journal lives in the target folder, so its bytes are untrusted input.
// An unterminated last line that is not a record is a torn append (a crash
// mid-write) and is ignored. Returns kCorruption for anything a migration
// never writes: a complete line that is not a record, a step that is not
// an integer 1..6, steps that do not run 1, 2, 3... from a first record
// naming both folders, or non-string folder names.
Result<std::vector<MigrateJournalRecord>> ParseMigrateJournal(std::string_view text);

// Where the file at `path` (canonical) was before `barge state migrate`
// moved its folder: the nearest folder above it holding the marker
// (kStateMarkerName) names the old folder, and the file's place below it is
// kept ("/new/sub/disk.qcow2" from "/old" -> "/old/sub/disk.qcow2", with the
// existing part of /old's path resolved as CanonicalPath does). "" when no
// marker is found, it cannot be read or it names no folder (the marker is
// untrusted: it is only ever a hint that backup compares with its chain).
std::string MovedFromLocation(Env& env, const std::string& path);

struct MigratedFile {
  std::string path;  // relative to the folder
  std::string kind;  // "file", "dir" or "symlink"
  uint64_t bytes = 0;
  std::string sha512;  // files only
};

struct StateMigrateResult {
  // "migrated", or "already-migrated" (journal says done, nothing to do).
  std::string outcome;
  // What recovery did with an earlier run's journal: "" (none), "rolled
  // back" (partial new copy removed, then migrated again) or "finished"
  // (the new copy was current; the old one's removal completed).
  std::string recovery;
  std::vector<MigratedFile> files;
};

// Moves `from` to `to` (which must not exist, be empty, or hold this
// migration's journal). Symlinks are copied as links; other special files
// are refused. A qcow2 file is copied byte for byte, so its bitmaps and its
// data-file and backing names stay as they are; one whose data file or
// backing file lies inside `from` (it would dangle) is refused.
// Returns the result; kInvalidArgument/kNotSupported before anything is
// touched; any other error before kCurrent leaves `from` current and removes
// the new copy; an error after it leaves the new copy current (run again to
// finish). May block for a long time. Every file operation goes through
// `env`: a test stops it after any durable step, or after any file copied,
// as a crash would (tests/testing/env_wrappers.h).
//
// A repoint moves what else names the folder's files (domain XML, the
// catalog) inside the journaled step: it is called with (from, to) after
// the copy is verified and before the commit point (its failure rolls the
// migration back), with (to, from) whenever a migration is rolled back, and
// with (from, to) again when recovery finishes a committed one. It must be
// idempotent.
using MigrateRepoint = std::function<Status(const std::string& old_dir, const std::string& new_dir)>;

struct MigrateOptions {
  // Switch libvirt's domains and the catalog with the folder (DomainRepoint,
  // state_repoint.h):
  // a running or paused domain using the folder is refused (kBusy) before
  // anything is touched, and the domains using it stay locked until the
  // migration ends.
  bool use_libvirt = false;
  std::string libvirt_uri;  // "" = BARGE_LIBVIRT_URI, else qemu:///system
  // --catalog: "" = the default place, used only when a catalog exists
  // there; an explicit one must exist (ExistingCatalogPath).
  std::string catalog_flag;
  // Another repoint, when not use_libvirt (tests).
  MigrateRepoint repoint;
};
Result<StateMigrateResult> MigrateState(Env& env, const std::string& from, const std::string& to,
                                        const MigrateOptions& options = {});

}  // namespace barge::orchestrate
