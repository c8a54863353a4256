// A replicate run's qcow2 shaping check and its one error (ReplicateOutcome).
#include "pipeline/replicate_outcome.h"

#include <gtest/gtest.h>

namespace barge::pipeline {
namespace {

TEST(ReplicateOutcomeTest, Qcow2ShapingOnlyForQcow2Copies) {
  EXPECT_TRUE(CheckQcow2Shaping(ReplicaFormat::kQcow2, "qcow2", "raw", true, true).ok());
  EXPECT_TRUE(CheckQcow2Shaping(ReplicaFormat::kKeep, "keep", "qcow2", true, false).ok());
  EXPECT_TRUE(CheckQcow2Shaping(ReplicaFormat::kRaw, "raw", "qcow2", false, false).ok());
  Status s = CheckQcow2Shaping(ReplicaFormat::kKeep, "keep", "raw", false, true);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.error().message(),
            "--cluster-size applies to qcow2 copies; these copies are raw (--format keep, a raw source): use --format "
            "qcow2");
  s = CheckQcow2Shaping(ReplicaFormat::kRaw, "raw", "qcow2", true, true);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.error().message().starts_with("--compress applies to qcow2 copies")) << s.error().message();
}

ReplicaResult Replica(ReplicaState state, std::optional<Error> error = std::nullopt) {
  ReplicaResult r;
  r.state = state;
  r.error = std::move(error);
  return r;
}

TEST(ReplicateOutcomeTest, OneErrorForTheRun) {
  ReplicateResult r;
  r.replicas = {Replica(ReplicaState::kReady), Replica(ReplicaState::kReady)};
  EXPECT_TRUE(ReplicateOutcome(r, "", "src").ok());

  r.replicas.push_back(Replica(ReplicaState::kFailed, Error::NoSpace("disk full").set_path("/b/c.qcow2")));
  r.replicas.push_back(Replica(ReplicaState::kFailed, Error::IoError("later")));
  Status s = ReplicateOutcome(r, "", "src");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNoSpace);
  EXPECT_EQ(s.error().path(), "/b/c.qcow2");
  EXPECT_EQ(s.error().message(), "2 of 4 copies failed (see the result for each); the first: disk full");

  r.replicas = {Replica(ReplicaState::kFailed)};
  s = ReplicateOutcome(r, "", "src");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kIoError);

  r.checksum_mismatch = true;
  r.sha512_hex = "ab";
  s = ReplicateOutcome(r, "cd", "src");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(s.error().path(), "src");
  EXPECT_EQ(s.error().message(), "checksum mismatch, nothing made ready: expected sha512 cd, the source has ab");
}

}  // namespace
}  // namespace barge::pipeline
