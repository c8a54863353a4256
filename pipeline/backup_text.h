// What `barge backup` says to a person, rendered from the run's result
// (pipeline/backup.h): the resume note before the copy and the summary
// after it. The cli prints these strings; --json is the cli's own.
#pragma once

#include <string>

#include "pipeline/backup.h"
#include "pipeline/backup_resume.h"

namespace barge::pipeline {

// Said before the copy starts, so a long resumed run shows it at once:
// how much of the work the staged image gives (and what of it is copied
// again), or why it is not reusable and the run starts over.
std::string ResumeNoteText(const ResumeNote& note);

// What the summary names beside the result: the source as it may be
// shown (no secrets), the internal snapshot read ("" = none), the catalog
// image the base came from ("" = none), and the bitmap the record came
// from ("" = an extents file).
struct BackupTextContext {
  std::string source;
  std::string snapshot;
  std::string catalog_image;
  std::string dirty_bitmap;
};

// The run's summary: type, id and source, reason, image, base, what was
// read (and dirty), changes found by digest and those the record missed,
// the clean-cluster sample, a resume, what was written, the image digest
// and the duration.
std::string BackupResultText(const BackupResult& r, const BackupTextContext& c);

}  // namespace barge::pipeline
