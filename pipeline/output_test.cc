// OpenOutput's replace policies (what an existing file needs), its sweep and
// abandon-on-destruction; MakeDestination's kinds and its refusals.
#include "pipeline/output.h"

#include <gtest/gtest.h>

#include "blockio/memory.h"
#include "formats/qcow2_format.h"
#include "pipeline/copy.h"
#include "pipeline/destination_spec.h"
#include "pipeline/overlay_destination.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

using testing::TempDir;

std::span<const std::byte> Bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

Result<std::unique_ptr<Output>> Open(const std::string& path, OutputReplace replace, bool force) {
  OutputSpec spec;
  spec.location = path;
  spec.replace = replace;
  spec.force = force;
  return OpenOutput(PosixEnv(), spec);
}

TEST(OutputTest, FileIsStagedAndCommittedOrAbandoned) {
  TempDir dir;
  Env& env = PosixEnv();
  const std::string out = dir / "out.raw";
  {
    auto o = Open(out, OutputReplace::kForceIfHoldsData, false);
    ASSERT_TRUE(o.ok()) << o.error().ToString();
    EXPECT_EQ((*o)->kind(), OutputKind::kFile);
    EXPECT_FALSE((*o)->in_place());
    EXPECT_EQ((*o)->temp_path(), TempPathFor(out));
    ASSERT_TRUE((*o)->sink().WriteAt(0, Bytes("kept")).ok());
    ASSERT_TRUE((*o)->Commit().ok());
  }
  EXPECT_EQ(*env.ReadFile(out), "kept");
  {
    // Destroyed uncommitted: the temporary goes, the file stays.
    auto o = Open(out, OutputReplace::kReplace, false);
    ASSERT_TRUE(o.ok()) << o.error().ToString();
    ASSERT_TRUE((*o)->sink().WriteAt(0, Bytes("lost")).ok());
    EXPECT_TRUE(env.Exists(TempPathFor(out)));
  }
  EXPECT_FALSE(env.Exists(TempPathFor(out)));
  EXPECT_EQ(*env.ReadFile(out), "kept");
}

TEST(OutputTest, ReplacePoliciesForAnExistingFile) {
  TempDir dir;
  Env& env = PosixEnv();
  const std::string full = dir / "full.raw";
  const std::string empty = dir / "empty.raw";
  ASSERT_TRUE(env.WriteFileAtomic(full, "data").ok());
  ASSERT_TRUE(env.WriteFileAtomic(empty, "").ok());
  // Restore: only a file that holds data needs force.
  auto refused = Open(full, OutputReplace::kForceIfHoldsData, false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message().find("--force"), std::string::npos);
  EXPECT_TRUE(Open(empty, OutputReplace::kForceIfHoldsData, false).ok());
  EXPECT_TRUE(Open(full, OutputReplace::kForceIfHoldsData, true).ok());
  // Convert: any existing file needs force.
  auto refused_empty = Open(empty, OutputReplace::kForceIfFileExists, false);
  ASSERT_FALSE(refused_empty.ok());
  EXPECT_EQ(refused_empty.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused_empty.error().ToString().find("--force"), std::string::npos);
  EXPECT_TRUE(Open(full, OutputReplace::kForceIfFileExists, true).ok());
  // Replicate: the caller decided.
  EXPECT_TRUE(Open(full, OutputReplace::kReplace, false).ok());
  // Not a place for a file at all.
  EXPECT_EQ(Open(dir.path().string(), OutputReplace::kReplace, true).error().code(), ErrorCode::kInvalidArgument);
}

TEST(OutputTest, SweepsAKilledRunsTemporary) {
  TempDir dir;
  Env& env = PosixEnv();
  const std::string other = dir / "other.raw";
  ASSERT_TRUE(env.WriteFileAtomic(TempPathFor(other), "leftover").ok());
  OutputSpec spec;
  spec.location = dir / "out.raw";
  spec.sweep = false;
  ASSERT_TRUE(OpenOutput(env, spec).ok());
  EXPECT_TRUE(env.Exists(TempPathFor(other)));
  spec.sweep = true;
  ASSERT_TRUE(OpenOutput(env, spec).ok());
  EXPECT_FALSE(env.Exists(TempPathFor(other)));
}

TEST(OutputTest, KindOfLocations) {
  TempDir dir;
  Env& env = PosixEnv();
  EXPECT_EQ(*OutputKindOf(env, "nbd://localhost/x"), OutputKind::kNbd);
  EXPECT_EQ(*OutputKindOf(env, "nbd://localhost/x", /*allow_nbd=*/false), OutputKind::kFile);
  EXPECT_EQ(*OutputKindOf(env, dir / "missing.raw"), OutputKind::kFile);
}

TEST(DestinationSpecTest, MakesEachKindAndRefusesBadSpecs) {
  MemorySink sink;
  DestinationSpec raw;
  raw.format = DestinationFormat::kRaw;
  raw.virtual_size = 1 << 20;
  auto r = MakeDestination(sink, raw);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->concurrent_consume());
  EXPECT_FALSE((*r)->qcow2_stats().has_value());

  MemorySink qsink;
  DestinationSpec q;
  q.virtual_size = 1 << 20;
  q.cluster_bytes = 4096;
  q.compression = formats::Compression::kZstd;
  auto d = MakeDestination(qsink, q);
  ASSERT_TRUE(d.ok()) << d.error().ToString();
  EXPECT_EQ((*d)->compression(), formats::Compression::kZstd);
  EXPECT_TRUE((*d)->qcow2_stats().has_value());

  MemorySink bad_sink;
  q.cluster_bytes = 3000;
  EXPECT_EQ(MakeDestination(bad_sink, q).error().code(), ErrorCode::kInvalidArgument);

  MemorySink overlay_sink;
  RangeList allocated;
  q.cluster_bytes = 4096;
  q.overlay_allocated = &allocated;
  EXPECT_EQ(MakeDestination(overlay_sink, q).error().code(), ErrorCode::kInvalidArgument);  // no backing name
  q.backing_file = "base.qcow2";
  MemorySink overlay_sink2;
  auto o = MakeDestination(overlay_sink2, q);
  ASSERT_TRUE(o.ok()) << o.error().ToString();
  EXPECT_TRUE((*o)->qcow2_stats().has_value());
}

TEST(DestinationSpecTest, ClusterBitsAndChunkRounding) {
  EXPECT_EQ(*formats::qcow2::ClusterBitsOf(512), 9u);
  EXPECT_EQ(*formats::qcow2::ClusterBitsOf(64 << 10), 16u);
  EXPECT_EQ(*formats::qcow2::ClusterBitsOf(2 << 20), 21u);
  EXPECT_FALSE(formats::qcow2::ClusterBitsOf(256).ok());
  EXPECT_FALSE(formats::qcow2::ClusterBitsOf(4 << 20).ok());
  EXPECT_FALSE(formats::qcow2::ClusterBitsOf(96 << 10).ok());
  EXPECT_EQ(ChunkBytesFor(1 << 20, 64 << 10), 1u << 20);
  EXPECT_EQ(ChunkBytesFor((1 << 20) + 100, 64 << 10), 1u << 20);
  EXPECT_EQ(ChunkBytesFor(1 << 20, 2 << 20), 2u << 20);
}

}  // namespace
}  // namespace barge::pipeline
