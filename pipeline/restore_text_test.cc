// What restore and verify say, and when verify's failure comes before its
// result (not with --all when points failed: every outcome is reported).
#include "pipeline/restore_text.h"

#include <gtest/gtest.h>

namespace barge::pipeline {
namespace {

VerifyOutcome Outcome(VerifyOutcome::State state, size_t position, const std::string& id) {
  VerifyOutcome o;
  o.state = state;
  o.position = position;
  o.id = id;
  o.started_at = "2026-01-0" + std::to_string(position + 1) + "T00:00:00Z";
  return o;
}

TEST(RestoreTextTest, PointAndRestoring) {
  EXPECT_EQ(PointText(2, ""), "position 2, taken (unknown)");
  formats::BackupManifest m;
  m.id = "p3";
  m.started_at = "2026-01-03T00:00:00Z";
  EXPECT_EQ(RestoringText(2, m, "/out.raw"),
            "restoring point p3 (position 2, taken 2026-01-03T00:00:00Z) to /out.raw\n");
  RestoreResult r;
  r.manifest = m;
  r.position = 2;
  r.layers = 1;
  EXPECT_EQ(RestoreResultText(r, "/out.raw").rfind(
                "restored point p3 (position 2, taken 2026-01-03T00:00:00Z, 1 layer) to /out.raw: ", 0),
            0u);
}

TEST(RestoreTextTest, AFailureEndsVerifyFirstUnlessAllReportsThePoints) {
  VerifyReport passed;
  EXPECT_FALSE(VerifyFailsBeforeResult(passed, false));
  VerifyReport failed;
  failed.points = {Outcome(VerifyOutcome::State::kPassed, 0, "a"), Outcome(VerifyOutcome::State::kFailed, 1, "b")};
  failed.failure = Error::Corruption("bad cluster");
  EXPECT_TRUE(VerifyFailsBeforeResult(failed, false));
  EXPECT_FALSE(VerifyFailsBeforeResult(failed, true));
  VerifyReport stopped;  // an interruption: no point failed, the run did
  stopped.failure = Error::Cancelled("stopped");
  EXPECT_TRUE(VerifyFailsBeforeResult(stopped, true));
}

TEST(RestoreTextTest, VerifyLinesThenTheCounts) {
  VerifyReport r;
  r.points = {Outcome(VerifyOutcome::State::kPassed, 0, "a"), Outcome(VerifyOutcome::State::kFailed, 1, "b"),
              Outcome(VerifyOutcome::State::kSkipped, 2, "c")};
  r.points[1].error = "damaged";
  r.points[2].failed_layer = "b";
  BaseVerifyOutcome base;
  base.chain_dir = "/b/base";
  base.id = "f";
  base.passed = true;
  r.bases = {base};
  r.failure = Error::Corruption("damaged");
  const std::string text = VerifyReportText(r);
  EXPECT_EQ(text.rfind("verified a (position 0, taken 2026-01-01T00:00:00Z)\n"
                       "FAILED b (position 1, taken 2026-01-02T00:00:00Z): damaged\n"
                       "skipped c (position 2, taken 2026-01-03T00:00:00Z): reads through b, which failed\n"
                       "verified base f (chain /b/base)\n"
                       "1 of 3 points verified, 1 FAILED, 1 skipped (",
                       0),
            0u)
      << text;
  VerifyReport ok;
  ok.clusters_checked = 7;
  ok.against_checked = true;
  EXPECT_EQ(VerifyReportText(ok).rfind("structure, 7 cluster digests (xxh3-128) and image digest OK; the source "
                                       "matches (",
                                       0),
            0u);
}

}  // namespace
}  // namespace barge::pipeline
