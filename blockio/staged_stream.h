// A stream (a pipe such as standard input, or a download from a server
// that serves no byte ranges) read once, front to back, into a private file,
// and that file as a read-only BlockSource: the readers of qcow2 and raw
// images then seek in it as in any file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "blockio/env.h"
#include "blockio/source.h"

namespace barge {

// Takes the stream's bytes at their offset from its first byte.
using StreamWriter = std::function<Status(uint64_t offset, std::span<const std::byte> bytes)>;

// Calls `fill` with a writer into a fresh file (O_EXCL, mode 0600) in a
// fresh folder made by Env::CreateTempDir under `dir` (mode 0700, prefix
// ".barge-stage-": a name nobody could plant beforehand), then opens the
// file read-only and unlinks it and its folder before returning: nothing is
// left behind after a failure or once the source is closed. The file and
// folder are registered (TempRegistration) while `fill` runs, so an
// interrupted process removes them too. The source's name() is `shown_name`
// (a URL, "standard input"), never the staging path. `fill` may rewrite
// from offset 0 (a download that starts again); the file then holds the
// last `fill`'s bytes, its length the highest end written. Errors: what
// `fill` returns, and those of creating, writing and opening the file.
Result<std::unique_ptr<BlockSource>> StageStream(Env& env, const std::string& dir, const std::string& shown_name,
                                                 const std::function<Status(const StreamWriter&)>& fill);

// Reads `fd` (a pipe, standard input) to its end into `write`, in chunks of
// up to 1 MiB; EINTR is retried. Returns the number of bytes read. A read
// error is kIoError naming `shown_name`.
Result<uint64_t> ReadFdToEnd(int fd, const std::string& shown_name, const StreamWriter& write);

}  // namespace barge
