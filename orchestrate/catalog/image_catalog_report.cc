#include "orchestrate/catalog/image_catalog_report.h"

#include <algorithm>

#include "formats/units.h"

namespace barge::orchestrate {

Result<ImageCatalogStatus> ReadImageCatalogStatus(ImageCatalog& catalog, const std::string& name) {
  ImageCatalogStatus s;
  BARGE_RETURN_IF_ERROR(catalog.RecoverInterrupted(name));
  BARGE_ASSIGN_OR_RETURN(s.images, catalog.Images(name));
  if (!name.empty() && s.images.empty()) {
    // Not in the catalog; if its last add failed, why.
    BARGE_ASSIGN_OR_RETURN(std::optional<FailedAddRecord> failed, catalog.FailedAdd(name));
    std::string why;
    if (failed) {
      why = "; its last add (from " + failed->source + " to " + failed->disk + ", " +
            formats::FormatRfc3339({failed->updated, 0}) + ") failed: " + failed->message;
    }
    return Error::NotFound("no image '" + name + "' in the catalog" + why);
  }
  BARGE_ASSIGN_OR_RETURN(s.copies, catalog.Copies(name));
  BARGE_ASSIGN_OR_RETURN(s.senders, catalog.Senders(name));
  return s;
}

Error CopyError(const ImageCopyRecord& c, std::string what) {
  bool no_space = c.message.starts_with(std::string(ErrorCodeName(ErrorCode::kNoSpace)) + ": ");
  return Error(no_space ? ErrorCode::kNoSpace : ErrorCode::kIoError, std::move(what)).set_path(c.path);
}

std::optional<Error> AddFailure(const ImageCopyRecord& c) {
  if (c.state == "ready") return std::nullopt;
  return CopyError(c, "the copy is " + c.state + (c.message.empty() ? "" : ": " + c.message));
}

std::optional<Error> SyncFailure(const SyncResult& r) {
  auto first = std::find_if(r.copies.begin(), r.copies.end(), [](const auto& c) { return c.state != "ready"; });
  if (first == r.copies.end()) return std::nullopt;
  const size_t failed = std::count_if(r.copies.begin(), r.copies.end(), [](const auto& c) { return c.state != "ready"; });
  return CopyError(*first, std::to_string(failed) + " of " + std::to_string(r.copies.size()) +
                               " copies are not ready (see the result for each); the first is " + first->state +
                               (first->message.empty() ? "" : ": " + first->message));
}

std::string CopyLine(const ImageCopyRecord& c) {
  std::string t = c.image + "  " + c.disk + "  " + c.state;
  if (c.state == "in-progress") {
    t += " " + std::to_string(static_cast<int>(c.percent)) + "%";
    if (c.bytes_total) t += " (" + formats::HumanBytes(c.bytes_done) + " of " + formats::HumanBytes(c.bytes_total) + ")";
  }
  if (!c.message.empty()) t += ": " + c.message;
  return t + "\n";
}

std::string SyncText(const std::string& image, const SyncResult& r) {
  std::string t;
  if (!r.downloaded_from.empty()) {
    t += "no ready copy was left: downloaded " + image + " again from its origin " + r.downloaded_from + "\n";
  }
  for (const auto& c : r.copies) t += CopyLine(c);
  for (const auto& s : r.senders) {
    t += "sender " + s.sender + ": " + std::to_string(s.sends) + " send(s), at most " +
         std::to_string(s.max_concurrent) + " at once\n";
  }
  return t;
}

std::string ImageStatusText(const ImageCatalogStatus& s) {
  std::string t;
  for (const auto& im : s.images) {
    t += im.name + " (" + im.format + ", " + formats::HumanBytes(im.virtual_size) + ", sha512 " +
         im.sha512.substr(0, 16) + "...)\n";
    for (const auto& c : s.copies) {
      if (c.image == im.name) t += "  " + CopyLine(c);
    }
  }
  return t;
}

std::string CleanupText(const CleanupResult& r) {
  std::string t;
  for (const auto& p : r.removed) t += (r.dry_run ? "would remove " : "removed ") + p + "\n";
  for (const auto& p : r.last_copy) t += "kept    " + p + "  (the image's last ready copy)\n";
  for (const auto& p : r.in_use) t += "in use  " + p + "\n";
  for (const auto& p : r.waiting) t += "waiting " + p + "\n";
  for (const auto& p : r.busy) t += "busy    " + p + "  (an add or sync of its image is running)\n";
  return t;
}

}  // namespace barge::orchestrate
