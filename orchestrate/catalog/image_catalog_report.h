// What `barge image add|sync|status|rescan|cleanup` find and say: the
// catalog's images with their copies and senders read as one status, the
// error a copy that is not ready ends a command with, and the text of
// each (orchestrate/catalog/image_catalog.h). --json is the cli's own.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "orchestrate/catalog/image_catalog.h"

namespace barge::orchestrate {

// The catalog's images (only `name`'s when not ""), their copies and senders.
struct ImageCatalogStatus {
  std::vector<ImageRecord> images;
  std::vector<ImageCopyRecord> copies;
  std::vector<SenderRecord> senders;
};

// Reads the status after settling copies whose sending process is gone
// (RecoverInterrupted: they show as failed, not in progress). kNotFound
// when `name` is given and the catalog has no such image (naming why its
// last add failed, when one did).
Result<ImageCatalogStatus> ReadImageCatalogStatus(ImageCatalog& catalog, const std::string& name);

// A copy that is not ready, as a command's error saying `what`: it names
// the copy's file, and a copy that failed for want of space is kNoSpace
// (its message is the send's error, Error::ToString, code first), so that
// scripts can tell a full disk from a broken one; else kIoError.
Error CopyError(const ImageCopyRecord& c, std::string what);

// `image add`'s error when its copy is not ready; nullopt when it is.
std::optional<Error> AddFailure(const ImageCopyRecord& c);

// `image sync`'s error when copies are not ready: how many, the first
// naming the error (the result lists each); nullopt when all are ready.
std::optional<Error> SyncFailure(const SyncResult& r);

// "IMAGE  DISK  STATE[ N% (DONE of TOTAL)][: message]" of a copy, one line.
std::string CopyLine(const ImageCopyRecord& c);

// `image sync`'s text: the download from the origin when there was one,
// a line per copy, then per sender what it served.
std::string SyncText(const std::string& image, const SyncResult& r);

// `image status`'s text: per image its format, size and digest, then its
// copies indented.
std::string ImageStatusText(const ImageCatalogStatus& s);

// `image cleanup`'s text: what was (or would be) removed and what was
// kept, and why.
std::string CleanupText(const CleanupResult& r);

}  // namespace barge::orchestrate
