// Verification records: encode/decode round trip, untrusted input, the
// stale check, and the atomic write beside the manifest.
#include "pipeline/verification_record.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "blockio/env.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

// An image file of `bytes` modified long before any record.
FileStat ImageStat(uint64_t bytes) {
  FileStat st;
  st.size_bytes = bytes;
  st.mtime_ns = 1;
  return st;
}

VerificationRecord Sample() {
  VerificationRecord r;
  r.id = "0001-20261122T151533Z";
  r.ok = true;
  r.verified_at = "2026-11-23T10:00:00Z";
  r.duration_seconds = 1.25;
  r.clusters_checked = 16384;
  r.image = "0001-20261122T151533Z.qcow2";
  r.image_bytes = 123456;
  r.image_digest = {0x0123456789abcdefull, 0xfedcba9876543210ull};
  return r;
}

TEST(VerificationRecord, RoundTrip) {
  for (bool ok : {true, false}) {
    VerificationRecord r = Sample();
    r.ok = ok;
    if (!ok) r.error = "Corruption: x.qcow2: cluster 7 (guest offset 458752) differs from its digest";
    const std::string text = EncodeVerificationRecord(r).value();
    EXPECT_NE(text.find("\"format\": \"barge-verification\""), std::string::npos) << text;
    EXPECT_NE(text.find(ok ? "\"result\": \"ok\"" : "\"result\": \"failed\""), std::string::npos) << text;
    auto back = DecodeVerificationRecord(text);
    ASSERT_TRUE(back.ok()) << back.error().ToString();
    EXPECT_EQ(back->id, r.id);
    EXPECT_EQ(back->ok, ok);
    EXPECT_EQ(back->error, r.error);
    EXPECT_EQ(back->verified_at, r.verified_at);
    EXPECT_DOUBLE_EQ(back->duration_seconds, 1.25);
    EXPECT_EQ(back->clusters_checked, 16384u);
    EXPECT_EQ(back->image, r.image);
    EXPECT_EQ(back->image_bytes, 123456u);
    EXPECT_EQ(back->image_digest, r.image_digest);
    EXPECT_EQ(back->image_digest_algorithm, formats::ImageDigestAlgorithm::kZeroRunFold);
  }
  // A record of a version 1 point keeps its fold.
  VerificationRecord v1 = Sample();
  v1.image_digest_algorithm = formats::ImageDigestAlgorithm::kClusterFold;
  const std::string text = EncodeVerificationRecord(v1).value();
  EXPECT_NE(text.find("\"xxh3-128-cluster-fold\""), std::string::npos) << text;
  auto back = DecodeVerificationRecord(text);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->image_digest_algorithm, formats::ImageDigestAlgorithm::kClusterFold);
}

TEST(VerificationRecord, UntrustedInputIsCorruption) {
  const std::string good = EncodeVerificationRecord(Sample()).value();
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  for (const std::string& bad :
       {std::string(), std::string("[]"), std::string("{"), std::string("{\"format\": \"barge-verification\"}"),
        with("barge-verification", "barge-backup-manifest"), with("\"format_version\": 1", "\"format_version\": 2"),
        with("\"result\": \"ok\"", "\"result\": \"maybe\""), with("\"image_bytes\": 123456", "\"image_bytes\": -1"),
        with("xxh3-128-zero-run-fold", "sha256"), with("fedcba9876543210", "zz"),
        // A field of another type is damage, not an exception.
        with("\"xxh3-128-zero-run-fold\"", "7"), with("\"xxh3-128-zero-run-fold\"", "null"),
        // list prints these as an RFC 3339 time and a number of seconds.
        with("2026-11-23T10:00:00Z", "yesterday"), with("\"duration_seconds\": ", "\"duration_seconds\": -")}) {
    auto r = DecodeVerificationRecord(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << bad;
  }
  // Unknown fields are fine.
  EXPECT_TRUE(DecodeVerificationRecord(with("\"id\"", "\"later\": [1, 2], \"id\"")).ok());
}

TEST(VerificationRecord, WrittenBesideTheManifestAndStaleWhenTheImageChanges) {
  testing::TempDir dir;
  ChainFolder chain;
  chain.dir = dir.path().string();
  ChainPoint p;
  p.manifest.id = "0000-20261122T150102Z";
  p.manifest.image = "0000-20261122T150102Z.qcow2";
  p.manifest.image_digest = {1, 2};
  chain.points.push_back(p);

  auto none = ReadLastVerification(PosixEnv(), chain, 0, ImageStat(4096), 0);
  ASSERT_TRUE(none.ok()) << none.error().ToString();
  EXPECT_FALSE(none->has_value());

  VerificationRecord r;
  r.id = p.manifest.id;
  r.ok = true;
  r.verified_at = "2026-11-23T10:00:00Z";
  r.image = p.manifest.image;
  r.image_bytes = 4096;
  r.image_digest = {1, 2};
  ASSERT_TRUE(WriteVerificationRecord(PosixEnv(), chain, 0, r).ok());
  EXPECT_TRUE(std::filesystem::exists(dir / "0000-20261122T150102Z.verified"));
  auto fresh = ReadLastVerification(PosixEnv(), chain, 0, ImageStat(4096), 0);
  ASSERT_TRUE(fresh.ok() && fresh->has_value());
  EXPECT_TRUE((*fresh)->record.ok);
  EXPECT_FALSE((*fresh)->stale);
  // Another image size (a merge rewrote it) or digest: stale.
  auto resized = ReadLastVerification(PosixEnv(), chain, 0, ImageStat(8192), 0);
  ASSERT_TRUE(resized.ok() && resized->has_value());
  EXPECT_TRUE((*resized)->stale);
  chain.points[0].manifest.image_digest = {3, 4};
  auto redigested = ReadLastVerification(PosixEnv(), chain, 0, ImageStat(4096), 0);
  ASSERT_TRUE(redigested.ok() && redigested->has_value());
  EXPECT_TRUE((*redigested)->stale);
  chain.points[0].manifest.image_digest = {1, 2};
  // Same size and digest, but the file was modified after the record was
  // written (bytes overwritten in place): stale.
  FileStat modified = ImageStat(4096);
  modified.mtime_ns = PosixEnv().Stat(dir / "0000-20261122T150102Z.verified")->mtime_ns + 1;
  auto touched = ReadLastVerification(PosixEnv(), chain, 0, modified, 0);
  ASSERT_TRUE(touched.ok() && touched->has_value());
  EXPECT_TRUE((*touched)->stale);
  // A record that keeps the layers' newest time: fresh while it is the
  // same, stale when any layer's time moved (either way).
  r.layers_mtime_ns = 5000;
  ASSERT_TRUE(WriteVerificationRecord(PosixEnv(), chain, 0, r).ok());
  for (int64_t now : {int64_t{5000}, int64_t{5001}, int64_t{4999}}) {
    auto with_time = ReadLastVerification(PosixEnv(), chain, 0, ImageStat(4096), now);
    ASSERT_TRUE(with_time.ok() && with_time->has_value());
    EXPECT_EQ((*with_time)->record.layers_mtime_ns, 5000);
    EXPECT_EQ((*with_time)->stale, now != 5000) << now;
  }
  // A damaged record is an error naming the file, not "never verified".
  ASSERT_TRUE(Env::Default().WriteFileAtomic(dir / "0000-20261122T150102Z.verified", std::string("{oops")).ok());
  auto damaged = ReadLastVerification(PosixEnv(), chain, 0, ImageStat(4096), 0);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.error().code(), ErrorCode::kCorruption);
  EXPECT_NE(damaged.error().path().find(".verified"), std::string::npos);
}

}  // namespace
}  // namespace barge::pipeline
