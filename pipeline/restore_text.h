// What `barge restore` and `barge verify` say to a person, rendered from
// their results (pipeline/restore.h); and verify's one decision of how a
// run ends. The cli prints these strings; --json is the cli's own.
#pragma once

#include <string>

#include "formats/manifest.h"
#include "pipeline/restore.h"

namespace barge::pipeline {

// "position 2, taken 2026-11-24T06:05:49Z": which point a command chose
// ("(unknown)" for a manifest without a start time).
std::string PointText(size_t position, const std::string& started_at);

// Said before a restore's data moves: "restoring point ID (POINT) to DEST".
// `destination` as it may be shown (no secrets).
std::string RestoringText(size_t position, const formats::BackupManifest& m, const std::string& destination);

// A restore's end: the point, its layers, the destination, the size, what
// was read, the image digest and the time.
std::string RestoreResultText(const RestoreResult& r, const std::string& destination);

// Whether `report`'s failure ends verify before its result (the error
// alone): always, except with --all (`all_points`) when points failed,
// where every point's outcome is reported first.
bool VerifyFailsBeforeResult(const VerifyReport& report, bool all_points);

// verify's text: a line per point (verified, FAILED with why, skipped with
// the layer it reads through) and per base, then the counts of a failed
// run or the verdict of one that passed.
std::string VerifyReportText(const VerifyReport& report);

}  // namespace barge::pipeline
