// The files of a chain folder as barge opens them, and whose folder it is:
// a chain folder may be writable by others (a shared target, a folder
// another user controls), so nothing planted in it is followed or waited
// on, and a folder another user owns is refused unless asked for.
#pragma once

#include <cstdint>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "blockio/file_options.h"

namespace barge::pipeline {

// The options a chain file (manifest, digest table, record, journal) is
// opened with: a regular file only (a FIFO named like one is refused at
// once, never waited on), never through a final symbolic link.
FileOptions ChainFileOptions();

// Reads a small chain file whole (Env::ReadOwnFile): kCorruption naming it
// when larger than `max_bytes`; a FIFO, socket, device, folder
// (kInvalidArgument) or symbolic link (ELOOP) under its name is refused,
// naming it.
Result<std::string> ReadChainFile(Env& env, const std::string& path, uint64_t max_bytes = 16 << 20);

// Process-wide: accept chain folders (and the folders holding them) that
// another user owns (`--allow-other-owner`). Off by default. Set once by
// the command line before any job runs.
void SetAllowOtherOwner(bool allow);
bool AllowOtherOwner();

// Refuses, unless AllowOtherOwner(), a folder barge is about to write in
// (a chain folder, or the target it is made in) that belongs to another
// user than the effective one (root's folders are trusted by everyone):
// the folder itself, a symbolic link at its name, or the nearest existing
// folder above it. Such a user could swap files, or the folder itself,
// for links into places only this user may write.
// Returns kInvalidArgument naming the folder and its owner's uid.
Status CheckFolderOwner(Env& env, const std::string& dir);

}  // namespace barge::pipeline
