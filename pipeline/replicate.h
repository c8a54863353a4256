// Replication: one source read once and fanned out to several files (backing
// images on several disks). Each copy is written under a temporary name,
// checked against the SHA-512 of the source's logical content, optionally
// re-read and verified, renamed, and described by a checksum record beside
// it. docs/replication.md has the design and the record's fields.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "blockio/http_client.h"
#include "formats/image.h"
#include "pipeline/backup_resume.h"
#include "pipeline/copy.h"
#include "pipeline/nbd_endpoint.h"

namespace barge::pipeline {

// Output format of every copy: kKeep is qcow2 for a qcow2 source and raw for
// anything else (raw file, block device, NBD export).
enum class ReplicaFormat : uint8_t { kKeep, kRaw, kQcow2 };
// "keep", "raw" or "qcow2"; else kInvalidArgument.
Result<ReplicaFormat> ParseReplicaFormat(std::string_view name);

// What happens to a qcow2 source's backing chain.
// kFlatten: every copy holds the whole guest view and names no backing file.
// kKeep: every copy (qcow2) holds only the clusters the source's top layer
// allocates (data as data, zero clusters as zero clusters, the rest
// unallocated) and names the same backing file and format as the source's
// header, verbatim; the user delivers the base next to each copy. Only for a
// qcow2 source with a backing file and qcow2 output (else kInvalidArgument).
// Either way the SHA-512 is that of the logical (guest) content.
enum class BackingPolicy : uint8_t { kFlatten, kKeep };
Result<BackingPolicy> ParseBackingPolicy(std::string_view name);

enum class ReplicaState : uint8_t {
  kReady,   // written, checked (and verified if asked), renamed, recorded
  kReused,  // an existing file whose record matches; not rewritten
  kFailed,  // see the error; no file or temporary left by this run
};
std::string_view ReplicaStateName(ReplicaState state);

// The resume journal of the copy at `path`: ".NAME.barge-resume" beside it.
std::string ReplicaJournalPath(const std::string& path);

// An NBD target (nbd://, nbds://, nbd+unix://) has no folder beside it: its
// checksum record and resume journal live in `state_dir`, under a name made
// from the URI without its secrets (RedactNbdUri): bytes outside
// [A-Za-z0-9_+=,.-] written %XX, cut to 120 bytes, then "-" and 16 hex
// digits of the redacted URI's xxh3-64. This is that path without a suffix;
// the record is it + ".sha512.json", the journal it + ".barge-resume".
std::string NbdTargetStatePath(const std::string& state_dir, const std::string& uri);

// The checksum record beside each copy (PATH.sha512.json).
struct ReplicaRecord {
  std::string sha512;           // of the logical (guest) content, lowercase hex
  uint64_t virtual_size = 0;
  std::string format;           // "raw" or "qcow2": the copy's format
  uint64_t file_bytes = 0;      // the copy's file size when recorded
  int64_t file_mtime_ns = 0;    // and its modification time
  std::string source;           // where it came from
  std::string source_format;
  std::string created;          // UTC, ISO 8601
  bool verified = false;        // re-read and compared when written
  std::vector<std::string> bitmaps;  // persistent bitmaps carried (qcow2)
  // The backing file name the copy stores (--backing keep); "" when
  // flattened. A copy is only reused for the same policy and name.
  std::string backing_file;
};

// PATH + ".sha512.json".
std::string ReplicaRecordPath(const std::string& path);
// Reads and parses the record of `path`. kNotFound when absent, kCorruption
// when malformed.
Result<ReplicaRecord> ReadReplicaRecord(Env& env, const std::string& path);
// Parses a record's text (it sits beside the copy on a disk: untrusted);
// kCorruption when malformed.
Result<ReplicaRecord> DecodeReplicaRecord(std::string_view text);
// Writes the record of `path` (Env::WriteFileAtomic: temporary name, fsync,
// rename, folder sync).
Status WriteReplicaRecord(Env& env, const std::string& path, const ReplicaRecord& record);
// True when the file at `path` exists with the record's size and mtime: the
// cheap check that it is still the file the record describes.
bool FileMatchesRecord(Env& env, const std::string& path, const ReplicaRecord& record);

struct ReplicateOptions {
  // Geometry, memory, threads, compression, stall_timeout and cancel are
  // used as given; sha512, failure_policy (kIsolate) and progress are set by
  // RunReplicate.
  CopyOptions copy;
  ReplicaFormat format = ReplicaFormat::kKeep;
  BackingPolicy backing = BackingPolicy::kFlatten;
  // "" or 128 hex digits. A mismatch marks nothing ready.
  std::string expected_sha512;
  // Re-read each new copy through our reader and compare its per-cluster
  // digests and SHA-512 with the copy pass (and its bitmaps with the
  // source's); reused copies get their SHA-512 recomputed. A kKeep copy is
  // read with its backing chain (the logical content).
  bool verify = false;
  // Replace an existing file that is not a matching copy (else that
  // destination fails).
  bool force = false;
  // Path policy for opening a kept backing chain when verifying a copy
  // (its backing name resolves against the copy's folder): the source's
  // flags. Empty allow_dirs: the copy's folder (and below) only.
  bool allow_any_path = false;
  std::vector<std::string> allow_dirs;
  // For the record.
  std::string source_location;
  std::string source_format;
  // Resumable (docs/formats/resume.md): each copy keeps a journal beside
  // its temporary (".NAME.barge-resume"); a run that fails because the
  // source did (its connection lost for good) keeps the temporary and the
  // journal, as does a killed one, and the next run of the same replicate
  // checks what was written against the digests and copies only the rest.
  // false: a staged copy is swept and the copy starts over. --backing keep
  // copies are not resumable.
  bool resume = true;
  // What the source is, in the resume key: "" for its location plus, for a
  // file, its size and mtime; else this (a catalog image's name and
  // SHA-512, whichever of its copies sends it), which must pin the content
  // (the pass's SHA-512 check against expected_sha512 catches a lie).
  std::string resume_identity;
  // NBD targets: connections and TLS (the --tls-* flags; a URI's own
  // tls-certificates= and tls-psk-file= count too). TLS requested is TLS
  // required.
  NbdAccess nbd;
  // An http(s) source's TLS and credentials, for callers that open the
  // source from these options (image add).
  HttpOptions source_http;
  // Where each NBD target's checksum record and resume journal are kept
  // (NbdTargetStatePath); created when missing. Required when a
  // destination is an NBD URI.
  std::string state_dir;
  // Told once, before the copy, when staged copies were found (resumed or
  // not). Must not block.
  std::function<void(const ResumeNote&)> on_resume;
  // (destination index, bytes done, bytes total), from the destinations'
  // serial nodes, at most ~10 per second per destination and once at the
  // end. Must not block.
  std::function<void(size_t, uint64_t, uint64_t)> progress;
};

struct ReplicaResult {
  std::string path;  // as given; an NBD URI without its secrets (RedactNbdUri)
  ReplicaState state = ReplicaState::kFailed;
  std::optional<Error> error;  // set when kFailed
  bool verified = false;
  uint64_t file_bytes = 0;
};

struct ReplicateResult {
  // Of the source's logical content; the expected one when the source was
  // not read (every destination reused by expected checksum).
  std::string sha512_hex;
  uint64_t virtual_size = 0;
  std::string format;  // the copies' format
  // With expected_sha512: the source's content differs; nothing is ready.
  bool checksum_mismatch = false;
  std::vector<std::string> bitmaps;  // persistent bitmaps carried to each copy
  bool bitmaps_dropped = false;      // the source had bitmaps but the copies are raw
  // --backing keep: the backing file name (and format) every copy stores.
  std::string backing_file;
  std::string backing_format;
  std::vector<ReplicaResult> replicas;  // in the order of `destinations`
  uint64_t bytes_read = 0;  // from the source, by this run
  std::chrono::nanoseconds elapsed{0};
  // When staged copies of an interrupted run were found: resumed (only the
  // rest read: staged_bytes of the source were not) or why not.
  std::optional<ResumeNote> resume;

  bool all_ok() const;  // no mismatch and no failed replica
};

// Copies `source` (opened with formats::OpenImage or OpenSource; it must
// outlive the call) to every path in `destinations` (regular files or NBD
// URIs, distinct) in one read pass. An NBD target is written in place, raw
// only (qcow2 copies with one are kInvalidArgument), every cluster below
// the source's size written (holes as zeroes); it must hold at least the
// source's virtual size (kNoSpace naming it), and one that holds data needs
// `force` unless this tool's record or journal for it is in `state_dir`. One failing or stalled destination is reported failed
// while the others complete. Blocks until done.
// Returns the result (failed replicas and a checksum mismatch are in it), or
// an error for what stops everything before any copy starts: bad options
// (kInvalidArgument, e.g. backing kKeep without a qcow2 source that has a
// backing file, or with raw output), a source bitmap that cannot be read
// (kCorruption: in use after a crash), a top layer that cannot be mapped.
// With kKeep and verify, a copy whose backing file is not beside it fails
// (kNotFound, naming the file); the others are unaffected. The copies,
// their records and the read-back go through `env` (a test that wraps it
// can fail one destination's writes: they are the sinks it opens under
// that destination's temporary name).
Result<ReplicateResult> RunReplicate(Env& env, formats::Image& source, std::span<const std::string> destinations,
                                     const ReplicateOptions& options);

}  // namespace barge::pipeline
