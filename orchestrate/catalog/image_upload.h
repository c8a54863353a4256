// `image add --source -`: an image uploaded on standard input (a user's
// `curl ... | barge image add`, an upload handler's pipe), staged privately
// in the catalog's folder and read from there like any file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "pipeline/endpoints.h"

namespace barge::orchestrate {

// The source that names standard input, and how it is shown and recorded.
inline constexpr std::string_view kUploadSource = "-";
inline constexpr std::string_view kUploadName = "standard input";

struct UploadSpec {
  int fd = 0;               // standard input
  uint64_t size_bytes = 0;  // --size: the stream's length in bytes; 0 = not declared
};

// An upload after its first bytes: the format they show ("qcow2" by its
// magic, else "raw"), for the copy's name before the rest is read.
struct UploadHead {
  std::vector<std::byte> bytes;  // up to 4, as read
  std::string format;
};

// Reads the stream's first bytes (up to the qcow2 magic's 4). An empty
// stream is kInvalidArgument; a read error kIoError.
Result<UploadHead> ReadUploadHead(const UploadSpec& spec);

// The rest of the stream after `head`, read to its end into a private file
// under `stage_dir` (StageStream: a fresh mkdtemp folder, the file created
// O_EXCL and unlinked once open, so nothing is left behind), and the image
// in it (pipeline::OpenObjectImage: a qcow2 naming a backing or data file
// is refused). A qcow2 on a pipe cannot be read without seeking (its
// tables point anywhere in the file), hence the staging, for raw alike.
// Errors: kIoError for a short stream (fewer bytes than spec.size_bytes)
// or a longer one, naming "standard input"; what the open of the image
// refuses (a qcow2 whose tables point past the stream's end); errors of
// reading and staging.
Result<pipeline::OpenedSource> OpenUpload(Env& env, const std::string& stage_dir, const UploadSpec& spec,
                                          const UploadHead& head);

}  // namespace barge::orchestrate
