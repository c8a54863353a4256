#include "pipeline/restore_text.h"

#include <sstream>

#include "formats/units.h"

namespace barge::pipeline {

using formats::HumanBytes;
using formats::HumanSeconds;

std::string PointText(size_t position, const std::string& started_at) {
  return "position " + std::to_string(position) + ", taken " + (started_at.empty() ? "(unknown)" : started_at);
}

std::string RestoringText(size_t position, const formats::BackupManifest& m, const std::string& destination) {
  return "restoring point " + m.id + " (" + PointText(position, m.started_at) + ") to " + destination + "\n";
}

std::string RestoreResultText(const RestoreResult& r, const std::string& destination) {
  std::ostringstream t;
  t << "restored point " << r.manifest.id << " (" << PointText(r.position, r.manifest.started_at) << ", " << r.layers
    << " layer" << (r.layers == 1 ? "" : "s") << ") to " << destination << ": " << HumanBytes(r.manifest.virtual_size)
    << ", read " << HumanBytes(r.bytes_read) << ", every cluster verified, image digest xxh3-128:"
    << r.image_digest.ToHex() << " in " << HumanSeconds(r.seconds) << "\n";
  return t.str();
}

bool VerifyFailsBeforeResult(const VerifyReport& report, bool all_points) {
  // With --all, a failed point does not hide the others.
  return report.failure && !(all_points && report.Count(VerifyOutcome::State::kFailed) > 0);
}

std::string VerifyReportText(const VerifyReport& report) {
  using State = VerifyOutcome::State;
  std::ostringstream t;
  for (const auto& o : report.points) {
    const std::string point = PointText(o.position, o.started_at);
    switch (o.state) {
      case State::kPassed:
        t << "verified " << o.id << " (" << point << ")\n";
        break;
      case State::kFailed:
        t << "FAILED " << o.id << " (" << point << "): " << o.error << "\n";
        break;
      case State::kSkipped:
        t << "skipped " << o.id << " (" << point << "): reads through " << o.failed_layer << ", which failed\n";
        break;
    }
  }
  for (const auto& b : report.bases) {
    if (b.passed) {
      t << "verified base " << b.id << " (chain " << b.chain_dir << ")\n";
    } else {
      t << "FAILED base " << b.id << " (chain " << b.chain_dir << "): " << b.error << "\n";
    }
  }
  if (report.failure) {
    t << report.Count(State::kPassed) << " of " << report.points.size() << " points verified, "
      << report.Count(State::kFailed) << " FAILED, " << report.Count(State::kSkipped) << " skipped ("
      << HumanSeconds(report.seconds) << ")\n";
  } else {
    t << "structure, " << report.clusters_checked << " cluster digests (xxh3-128) and image digest OK"
      << (report.against_checked ? "; the source matches" : "") << " (" << HumanSeconds(report.seconds) << ")\n";
  }
  return t.str();
}

}  // namespace barge::pipeline
