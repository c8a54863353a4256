// Opening what jobs write to: a file staged under a temporary name and
// published by rename when complete (pipeline/staged_file.h), a block device
// or an NBD export written in place. The twin of pipeline/endpoints.h's
// OpenSource.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "blockio/env.h"
#include "blockio/nbd.h"
#include "blockio/sink.h"
#include "pipeline/file_access.h"
#include "pipeline/nbd_endpoint.h"
#include "pipeline/staged_file.h"

namespace barge::pipeline {

enum class OutputKind : uint8_t { kFile, kBlockDevice, kNbd };

// What an existing output needs before it is written over.
enum class OutputReplace : uint8_t {
  // One that holds data needs `force`: a non-empty file (an empty one is
  // replaced), a block device (reported as all data), an NBD export that
  // reports data. Restore.
  kForceIfHoldsData,
  // An existing file needs `force` (the refusal says "use --force"); a block
  // device is written in place without. Convert.
  kForceIfFileExists,
  // The caller has decided: an existing file is replaced. Replicate.
  kReplace,
};

struct OutputSpec {
  std::string location;  // file path, block device or (with allow_nbd) NBD URI
  OutputReplace replace = OutputReplace::kForceIfHoldsData;
  bool force = false;
  // false: no fdatasync of the file nor fsync of its folder (see
  // StagedFile::Create).
  bool sync = true;
  // NBD URIs are outputs; else one is taken for a file path.
  bool allow_nbd = true;
  // Connections and TLS for an NBD URI (pipeline/nbd_endpoint.h).
  NbdAccess nbd;
  // A device or export must hold this many bytes (the disk's size); kNoSpace
  // when it holds fewer.
  uint64_t size_bytes = 0;
  // A file: who may read it (pipeline/file_access.h). Set: a file made
  // anew gets its mode and group exactly (restore, convert: private unless
  // `--group`); a file replaced keeps its own mode (and, as root, group).
  // Unset: 0644, the umask applying (a replica QEMU opens).
  std::optional<FileAccess> access;
  // Remove the stale temporaries of killed runs in the file's folder first
  // (SweepStaleTemporaries); a live writer's are kept.
  bool sweep = true;
  // An NBD export's reconnecting after a drop.
  NbdRetryPolicy nbd_retry;
  // A file: take over the temporary a killed or failed run left
  // (StagedFile::Adopt, replacing the file when `replace` is kReplace)
  // instead of starting a new one; kNotFound when it is gone.
  bool adopt = false;
};

// What `location` names as an output: an NBD URI (when `allow_nbd`), an
// existing block device, else a file. An error when it cannot be looked at
// (a missing file is a file).
Result<OutputKind> OutputKindOf(Env& env, const std::string& location, bool allow_nbd = true);

// An opened output. One thread at a time. Destroyed uncommitted, it abandons
// the output: a staged file's temporary is removed; a device or export keeps
// what was written (it is written in place).
class Output {
 public:
  ~Output() = default;
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  OutputKind kind() const { return kind_; }
  // A block device or an NBD export: old bytes stay where nothing is written.
  bool in_place() const { return kind_ != OutputKind::kFile; }
  const std::string& location() const { return location_; }
  // The sink to write; errors name `location`.
  BlockSink& sink() { return staged_ ? staged_->sink() : *in_place_; }
  // A staged file's temporary name ("" for a device or export).
  std::string temp_path() const { return staged_ ? staged_->temp_path() : std::string(); }

  // Flushes; a staged file is then published under its name (StagedFile::
  // Commit: a failure before the publish removes the temporary).
  Status Commit();
  // A staged file's temporary is removed now (StagedFile::Abandon); nothing
  // happens to a device or export.
  Status Abandon();
  // A staged file's temporary is flushed and left for a later run to
  // adopt (StagedFile::Keep); nothing happens to a device or export.
  Status Keep();
  // A device or export: flushed and closed now, so that a server taking
  // one client at a time (qemu-nbd without --shared) can be read back by
  // another connection; sink() must not be used after it, and Commit only
  // says so. Nothing for a staged file.
  Status CloseInPlace();

 private:
  friend Result<std::unique_ptr<Output>> OpenOutput(Env& env, const OutputSpec& spec);
  Output(OutputKind kind, std::string location) : kind_(kind), location_(std::move(location)) {}
  OutputKind kind_;
  std::string location_;
  std::unique_ptr<StagedFile> staged_;
  std::unique_ptr<BlockSink> in_place_;
};

// Opens the output `spec` names, through `env` (which must outlive it).
// Returns the output, or:
// - a file: CheckOutputPath's refusals (a folder, /dev/null, a missing
//   folder); kInvalidArgument for an existing file that `replace` refuses
//   without `force`; StagedFile::Create's errors (kBusy: another writer);
// - a device or export: kInvalidArgument when it holds data and `replace`
//   is kForceIfHoldsData without `force`; kNoSpace when it holds fewer than
//   `size_bytes`; the open's errors.
Result<std::unique_ptr<Output>> OpenOutput(Env& env, const OutputSpec& spec);

}  // namespace barge::pipeline
