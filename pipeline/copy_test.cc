// Tests of RunCopy: memory source to memory sinks through the flow graph,
// fan-out, work sets, digests, errors, isolation, cancellation, memory bound.
#include "pipeline/copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <openssl/evp.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include <oneapi/tbb/task_arena.h>

#include "blockio/fault.h"
#include "blockio/memory.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

constexpr uint32_t kCluster = 64 << 10;
constexpr uint64_t kMiB = 1 << 20;

// 8 MiB + a short cluster: random data with a hole at [1 MiB, 2.5 MiB), a
// zero extent at [4 MiB, 4.25 MiB), zero bytes inside a data extent at
// [6 MiB, 6.125 MiB) and a hole at the very end.
struct TestDisk {
  std::vector<std::byte> bytes;
  ExtentList extents;
  std::unique_ptr<MemorySource> Source() const { return std::make_unique<MemorySource>(bytes, extents, "src"); }
};

TestDisk MakeDisk() {
  TestDisk d;
  const uint64_t size = 8 * kMiB + 12345;
  d.bytes = testing::RandomBytes(size, 42);
  d.extents = {
      {0, 1 * kMiB, ExtentKind::kData},
      {1 * kMiB, 1536 << 10, ExtentKind::kHole},
      {2560 << 10, 1536 << 10, ExtentKind::kData},
      {4 * kMiB, 256 << 10, ExtentKind::kZero},
      {4352 << 10, (8 * kMiB) - (4352 << 10), ExtentKind::kData},
      {8 * kMiB, 12345, ExtentKind::kHole},
  };
  for (const Extent& e : d.extents) {
    if (e.kind != ExtentKind::kData) std::memset(d.bytes.data() + e.offset, 0, e.length);
  }
  std::memset(d.bytes.data() + 6 * kMiB, 0, 128 << 10);
  return d;
}

std::string Sha512Hex(std::span<const std::byte> data) {
  unsigned char md[64];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha512(), nullptr);
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", md[i]);
    out += b;
  }
  return out;
}

formats::Digest128 DirectImageDigest(std::span<const std::byte> bytes, uint32_t cluster) {
  formats::ImageDigestBuilder b(formats::kCurrentImageDigestAlgorithm, cluster);
  for (uint64_t off = 0; off < bytes.size(); off += cluster) {
    b.Add(formats::HashCluster(bytes.subspan(off, std::min<uint64_t>(cluster, bytes.size() - off)), cluster));
  }
  return b.Finish();
}

CopyOptions SmallOptions() {
  CopyOptions o;
  o.cluster_bytes = kCluster;
  o.chunk_bytes = 1 << 20;
  o.memory_bytes = 8 * kMiB;
  o.threads = 2;
  return o;
}

bool Overlaps(const SinkOp& op, uint64_t offset, uint64_t length) {
  return op.offset < offset + length && offset < op.offset + op.length;
}

// Calls a hook from Consume (to cancel, count, or check invariants).
class HookDestination final : public Destination {
 public:
  explicit HookDestination(std::function<Status(const Chunk&)> hook) : hook_(std::move(hook)) {}
  const std::string& name() const override { return name_; }
  Status Consume(const Chunk& chunk) override { return hook_(chunk); }
  Status Finish() override { return OkStatus(); }

 private:
  std::string name_ = "hook";
  std::function<Status(const Chunk&)> hook_;
};

// A source that looks remote (reads wait on several network streams) with
// a given request size; reads come from `inner`.
class RemoteLikeSource final : public BlockSource {
 public:
  RemoteLikeSource(BlockSource& inner, uint32_t request_bytes) : inner_(inner), request_bytes_(request_bytes) {}
  const std::string& name() const override { return inner_.name(); }
  uint64_t size_bytes() const override { return inner_.size_bytes(); }
  SourceCapabilities capabilities() const override {
    SourceCapabilities caps = inner_.capabilities();
    caps.preferred_request_bytes = request_bytes_;
    caps.blocking_read_streams = 4;
    return caps;
  }
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override { return inner_.ReadAt(offset, out); }
  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override { return inner_.Extents(offset, length); }

 private:
  BlockSource& inner_;
  uint32_t request_bytes_;
};

// The chunk size a copy of `source` used: its pool's bytes per chunk.
uint64_t ChunkBytesUsed(BlockSource& source, uint64_t memory_bytes, const std::vector<std::byte>& expect) {
  MemorySink sink;
  RawDestination dest(sink, {source.size_bytes()});
  Destination* dests[] = {&dest};
  CopyOptions o = SmallOptions();
  o.chunk_bytes = 1 << 20;
  o.threads = 1;
  o.memory_bytes = memory_bytes;
  auto r = RunCopy(source, WholeDisk(source), dests, o);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  if (!r.ok()) return 0;
  EXPECT_EQ(sink.contents(), expect);
  return r->pool_chunks ? r->pool_bytes / r->pool_chunks : 0;
}

TEST(RunCopyTest, RemoteSourceIsReadInCallsOfFourRequests) {
  TestDisk disk = MakeDisk();
  auto local = disk.Source();
  // A local source keeps the copy's chunk size.
  EXPECT_EQ(ChunkBytesUsed(*local, 256u << 20, disk.bytes), 1u << 20);
  // 1 MiB requests (NBD over TLS): calls of 4 MiB.
  RemoteLikeSource tls(*local, 1 << 20);
  EXPECT_EQ(ChunkBytesUsed(tls, 256u << 20, disk.bytes), 4u << 20);
  // 256 KiB requests (plaintext NBD): 4 of them are the 1 MiB chunk already.
  RemoteLikeSource plain(*local, 256 << 10);
  EXPECT_EQ(ChunkBytesUsed(plain, 256u << 20, disk.bytes), 1u << 20);
  // The memory ceiling holds 8 chunks (one worker) of 2 MiB, not of 4.
  EXPECT_EQ(ChunkBytesUsed(tls, 24u << 20, disk.bytes), 2u << 20);
}

TEST(RunCopyTest, RawCopyIsIdenticalAndSkipsHoles) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink sink;
  RawDestination dest(sink, {source->size_bytes()});
  Destination* dests[] = {&dest};
  JobStats stats;
  CopyOptions o = SmallOptions();
  o.stats = &stats;
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  o.progress = [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); };

  auto r = RunCopy(*source, WholeDisk(*source), dests, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(sink.contents(), disk.bytes);
  // Only data extents are read; the hole, zero extent and tail hole are not.
  EXPECT_EQ(r->bytes_read, 8 * kMiB - (1536 << 10) - (256 << 10));
  EXPECT_EQ(r->bytes_processed, source->size_bytes());
  EXPECT_EQ(r->clusters.hole, 24u + 1u);
  EXPECT_EQ(r->clusters.zero, 4u + 2u);  // extent + detected
  EXPECT_EQ(r->clusters.compressed, 0u);
  EXPECT_EQ(r->clusters.data, 128u - 24 - 4 - 2);
  for (const SinkOp& op : sink.ops()) {
    if (op.kind != SinkOp::Kind::kWrite && op.kind != SinkOp::Kind::kZero) continue;
    EXPECT_FALSE(Overlaps(op, 1 * kMiB, 1536 << 10)) << op.offset;
    EXPECT_FALSE(Overlaps(op, 4 * kMiB, 256 << 10)) << op.offset;
    EXPECT_FALSE(Overlaps(op, 6 * kMiB, 128 << 10)) << op.offset;
    EXPECT_FALSE(Overlaps(op, 8 * kMiB, 12345)) << op.offset;
    EXPECT_NE(op.kind, SinkOp::Kind::kZero);  // a memory sink starts zeroed
  }
  // Writes are whole data runs of a chunk: the first chunk is one 1 MiB write
  // (writes to a raw sink may run in any order).
  EXPECT_NE(std::find(sink.ops().begin(), sink.ops().end(), SinkOp{SinkOp::Kind::kWrite, 0, kMiB}),
            sink.ops().end());
  EXPECT_EQ(sink.ops().back().kind, SinkOp::Kind::kFlush);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), std::make_pair(source->size_bytes(), source->size_bytes()));
  EXPECT_EQ(stats.Get(Stage::kRead).items, 9u);
  EXPECT_EQ(stats.Get(Stage::kWrite).items, 9u);
  EXPECT_EQ(r->destinations.size(), 1u);
  EXPECT_TRUE(r->destinations[0].status.ok());
  EXPECT_EQ(r->destinations[0].chunks_consumed, 9u);
  EXPECT_EQ(r->image_digest, DirectImageDigest(disk.bytes, kCluster));
}

TEST(RunCopyTest, SinkThatIsNotZeroInitializedGetsZeroes) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink sink(source->size_bytes());
  // Pre-fill with garbage; zero_initialized is still claimed by MemorySink,
  // so ask the destination to write zeroes anyway.
  std::vector<std::byte> junk(source->size_bytes(), std::byte{0x5a});
  ASSERT_TRUE(sink.WriteAt(0, junk).ok());
  RawDestination dest(sink, {source->size_bytes(), /*skip_zeroes_if_zero_initialized=*/false});
  Destination* dests[] = {&dest};
  auto r = RunCopy(*source, WholeDisk(*source), dests, SmallOptions());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(sink.contents(), disk.bytes);
}

TEST(RunCopyTest, FanOutToThreeSinksIsIdentical) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink sinks[3];
  RawDestination d0(sinks[0], {source->size_bytes()}), d1(sinks[1], {source->size_bytes()}),
      d2(sinks[2], {source->size_bytes()});
  Destination* dests[] = {&d0, &d1, &d2};
  FaultSource counted(*source);
  auto r = RunCopy(counted, WholeDisk(*source), dests, SmallOptions());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  for (auto& s : sinks) EXPECT_EQ(s.contents(), disk.bytes);
  EXPECT_EQ(sinks[0].ops(), sinks[1].ops());
  EXPECT_EQ(sinks[0].ops(), sinks[2].ops());
  // Read once for all three.
  EXPECT_EQ(r->bytes_read, 8 * kMiB - (1536 << 10) - (256 << 10));
}

TEST(RunCopyTest, WorkSetCopiesOnlyThoseClusters) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink sink;
  RawDestination dest(sink, {source->size_bytes()});
  Destination* dests[] = {&dest};
  // Unaligned ranges widen to clusters: [64K,192K), [3M, 3M+64K), [7.9M, 8M+64K).
  RangeList work = {{70000, 100000}, {3 * kMiB + 5, 10}, {8 * kMiB - 100, 200}};
  CopyOptions o = SmallOptions();
  o.record_zero_digests = true;
  auto r = RunCopy(*source, work, dests, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  RangeList aligned = AlignRanges(work, kCluster, source->size_bytes());
  std::vector<std::byte> want(source->size_bytes());
  for (const Range& a : aligned) std::memcpy(want.data() + a.offset, disk.bytes.data() + a.offset, a.length);
  EXPECT_EQ(sink.contents(), want);
  for (const SinkOp& op : sink.ops()) {
    if (op.kind != SinkOp::Kind::kWrite) continue;
    bool inside = false;
    for (const Range& a : aligned) inside |= op.offset >= a.offset && op.offset + op.length <= a.end();
    EXPECT_TRUE(inside) << op.offset << "+" << op.length;
  }
  EXPECT_EQ(r->bytes_processed, TotalBytes(aligned));
  // Digests: two clusters of [64K,192K), cluster 48, 127 and the short one.
  std::vector<uint64_t> idx;
  for (const ClusterDigest& d : r->cluster_digests) idx.push_back(d.cluster_index);
  EXPECT_EQ(idx, (std::vector<uint64_t>{1, 2, 48, 127, 128}));
}

TEST(RunCopyTest, Sha512AndImageDigestMatchDirectComputation) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  CopyOptions o = SmallOptions();
  o.sha512 = true;
  // No destination at all: a verify/hash-only job.
  auto r = RunCopy(*source, WholeDisk(*source), {}, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->sha512_hex, Sha512Hex(disk.bytes));
  EXPECT_EQ(r->image_digest, DirectImageDigest(disk.bytes, kCluster));
  // Digests of data clusters only, in order, each matching HashCluster.
  uint64_t last = 0;
  for (const ClusterDigest& d : r->cluster_digests) {
    EXPECT_GE(d.cluster_index, last);
    last = d.cluster_index;
    uint64_t off = d.cluster_index * kCluster;
    auto bytes = std::span(disk.bytes).subspan(off, std::min<uint64_t>(kCluster, disk.bytes.size() - off));
    EXPECT_EQ(d.digest, formats::HashCluster(bytes, kCluster));
  }
  EXPECT_EQ(r->cluster_digests.size(), r->clusters.data);
}

// The SHA-512 stream with destinations: the disk's, in guest order, with a
// destination that fails on the way (isolated), with one worker thread, and
// with a pool of few chunks (no hang).
TEST(RunCopyTest, Sha512BesideDestinationsWithFailureAndOneThread) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  for (int threads : {1, 2, 0}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    MemorySink good, bad_target;
    FaultSink bad(bad_target);
    bad.faults().AddRule(FaultRule::NthAndAfter(FaultOp::kWrite, 3, EIO));
    RawDestination d0(good, {source->size_bytes()}), d1(bad, {source->size_bytes()});
    Destination* dests[] = {&d0, &d1};
    CopyOptions o = SmallOptions();
    o.threads = threads;
    o.memory_bytes = 4 * kMiB;
    o.sha512 = true;
    o.failure_policy = DestinationFailurePolicy::kIsolate;
    auto r = RunCopy(*source, WholeDisk(*source), dests, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    EXPECT_EQ(r->sha512_hex, Sha512Hex(disk.bytes));
    EXPECT_TRUE(r->destinations[0].status.ok());
    EXPECT_FALSE(r->destinations[1].status.ok());
    EXPECT_EQ(good.contents(), disk.bytes);
  }
}

TEST(RunCopyTest, ImageDigestOfIncrementalUsesBaseDigests) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  // The "parent" had other bytes; clusters outside the work set come from it.
  std::vector<std::byte> parent = testing::RandomBytes(disk.bytes.size(), 99);
  RangeList work = {{2 * kMiB, 3 * kMiB}};
  CopyOptions o = SmallOptions();
  o.base_digest = [&](uint64_t c) -> std::optional<formats::Digest128> {
    uint64_t off = c * kCluster;
    return formats::HashCluster(std::span(parent).subspan(off, std::min<uint64_t>(kCluster, parent.size() - off)),
                                kCluster);
  };
  auto r = RunCopy(*source, work, {}, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  std::vector<std::byte> merged = parent;
  std::memcpy(merged.data() + 2 * kMiB, disk.bytes.data() + 2 * kMiB, 3 * kMiB);
  EXPECT_EQ(r->image_digest, DirectImageDigest(merged, kCluster));
}

TEST(RunCopyTest, CompressionMakesPayloadsForQcow2LikeDestinations) {
  // A destination that wants zstd payloads checks each one decompresses.
  std::vector<std::byte> bytes(4 * kMiB);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte((i / 512) % 13);
  MemorySource source(bytes);
  class Check final : public Destination {
   public:
    const std::string& name() const override { return name_; }
    formats::Compression compression() const override { return formats::Compression::kZstd; }
    Status Consume(const Chunk& c) override {
      for (size_t i = 0; i < c.cluster_count(); ++i) {
        if (c.states[i] != ClusterState::kCompressed) continue;
        std::vector<std::byte> out(c.cluster_bytes());
        BARGE_RETURN_IF_ERROR(formats::DecompressCluster(formats::Compression::kZstd, c.Payload(i), out));
        if (std::memcmp(out.data(), c.ClusterData(i).data(), out.size()) != 0) return Error::Corruption("bad");
        ++checked;
      }
      return OkStatus();
    }
    Status Finish() override { return OkStatus(); }
    std::string name_ = "check";
    uint64_t checked = 0;
  } check;
  Destination* dests[] = {&check};
  auto r = RunCopy(source, WholeDisk(source), dests, SmallOptions());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->clusters.compressed, 64u);
  EXPECT_EQ(check.checked, 64u);
  // A copy asked to compress with another type refuses.
  CopyOptions o = SmallOptions();
  o.compression = formats::Compression::kDeflate;
  auto bad = RunCopy(source, WholeDisk(source), dests, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
}

TEST(RunCopyTest, VerifyMismatchFailsWithTheOffset) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink sink;
  RawDestination dest(sink, {source->size_bytes()});
  Destination* dests[] = {&dest};
  CopyOptions o = SmallOptions();
  o.verify = [&](uint64_t c) -> std::optional<formats::Digest128> {
    uint64_t off = c * kCluster;
    auto d = formats::HashCluster(
        std::span(disk.bytes).subspan(off, std::min<uint64_t>(kCluster, disk.bytes.size() - off)), kCluster);
    if (c == 77) d.low ^= 1;
    return d;
  };
  auto r = RunCopy(*source, WholeDisk(*source), dests, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(r.error().offset(), std::optional<uint64_t>(77 * kCluster));
  EXPECT_NE(r.error().message().find("verify"), std::string::npos) << r.error().ToString();
  // The bad chunk never reached the sink.
  for (const SinkOp& op : sink.ops()) EXPECT_FALSE(Overlaps(op, 77 * kCluster, kCluster));
}

std::unique_ptr<BufferPool> MakePool(size_t count, bool scratch = false) {
  auto p = BufferPool::Create({1 << 20, kCluster, scratch, count});
  return p.ok() ? std::move(p).value() : nullptr;
}

TEST(RunCopyTest, SourceReadErrorMidStreamFailsWithOffset) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  FaultSource faulty(*source);
  faulty.faults().AddRule(FaultRule::InRange(FaultOp::kRead, 5 * kMiB + 4096, 1, EIO));
  MemorySink sink;
  RawDestination dest(sink, {source->size_bytes()});
  Destination* dests[] = {&dest};
  auto pool = MakePool(4);
  CopyOptions o = SmallOptions();
  o.pool = pool.get();
  auto r = RunCopy(faulty, WholeDisk(*source), dests, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kIoError);
  EXPECT_EQ(r.error().errno_value(), EIO);
  EXPECT_EQ(r.error().offset(), std::optional<uint64_t>(5 * kMiB));  // the run's start
  EXPECT_NE(r.error().message().find("read"), std::string::npos) << r.error().ToString();
  EXPECT_EQ(pool->outstanding(), 0u);
  EXPECT_LE(pool->high_water(), pool->capacity());
  // The pool is whole again: a second copy with it works.
  faulty.faults().ClearRules();
  auto again = RunCopy(faulty, WholeDisk(*source), dests, o);
  ASSERT_TRUE(again.ok()) << again.error().ToString();
  EXPECT_EQ(sink.contents(), disk.bytes);
}

class SinkErrorTest : public ::testing::TestWithParam<int> {};

TEST_P(SinkErrorTest, WriteErrorFailsTheCopy) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink target;
  FaultSink sink(target);
  sink.faults().AddRule(FaultRule::Nth(FaultOp::kWrite, 3, GetParam()));
  RawDestination dest(sink, {source->size_bytes()});
  Destination* dests[] = {&dest};
  auto pool = MakePool(4);
  CopyOptions o = SmallOptions();
  o.pool = pool.get();
  auto r = RunCopy(*source, WholeDisk(*source), dests, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().errno_value(), GetParam());
  EXPECT_EQ(r.error().code(), GetParam() == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIoError);
  EXPECT_NE(r.error().message().find("write"), std::string::npos) << r.error().ToString();
  EXPECT_TRUE(r.error().offset().has_value());
  EXPECT_EQ(pool->outstanding(), 0u);
  // Nothing after the failed write: no flush of a broken copy.
  for (const SinkOp& op : target.ops()) EXPECT_NE(op.kind, SinkOp::Kind::kFlush);
}

INSTANTIATE_TEST_SUITE_P(Errnos, SinkErrorTest, ::testing::Values(EIO, ENOSPC));

TEST(RunCopyTest, FinishErrorFailsTheCopy) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink target;
  FaultSink sink(target);
  sink.faults().AddRule(FaultRule::Always(FaultOp::kFlush, EIO));
  RawDestination dest(sink, {source->size_bytes()});
  Destination* dests[] = {&dest};
  auto r = RunCopy(*source, WholeDisk(*source), dests, SmallOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("finish"), std::string::npos) << r.error().ToString();
}

TEST(RunCopyTest, IsolateKeepsTheHealthyDestinations) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink good0, good1, bad_target;
  FaultSink bad(bad_target);
  bad.faults().AddRule(FaultRule::NthAndAfter(FaultOp::kWrite, 2, EIO));
  RawDestination d0(good0, {source->size_bytes()}), d1(bad, {source->size_bytes()}),
      d2(good1, {source->size_bytes()});
  Destination* dests[] = {&d0, &d1, &d2};
  CopyOptions o = SmallOptions();
  o.failure_policy = DestinationFailurePolicy::kIsolate;
  auto r = RunCopy(*source, WholeDisk(*source), dests, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(r->destinations[0].status.ok());
  ASSERT_FALSE(r->destinations[1].status.ok());
  EXPECT_EQ(r->destinations[1].status.error().errno_value(), EIO);
  EXPECT_TRUE(r->destinations[2].status.ok());
  EXPECT_EQ(good0.contents(), disk.bytes);
  EXPECT_EQ(good1.contents(), disk.bytes);
  // The failed one was neither finished nor flushed.
  for (const SinkOp& op : bad_target.ops()) EXPECT_NE(op.kind, SinkOp::Kind::kFlush);
}

TEST(RunCopyTest, IsolateFailsWhenEveryDestinationFails) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  MemorySink t0, t1;
  FaultSink s0(t0), s1(t1);
  s0.faults().AddRule(FaultRule::Always(FaultOp::kWrite, EIO));
  s1.faults().AddRule(FaultRule::Always(FaultOp::kWrite, ENOSPC));
  RawDestination d0(s0, {source->size_bytes()}), d1(s1, {source->size_bytes()});
  Destination* dests[] = {&d0, &d1};
  CopyOptions o = SmallOptions();
  o.failure_policy = DestinationFailurePolicy::kIsolate;
  auto r = RunCopy(*source, WholeDisk(*source), dests, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("every destination failed"), std::string::npos) << r.error().ToString();
}

TEST(RunCopyTest, StalledDestinationIsIsolated) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  // Margins are wide so that a loaded CI machine does not stall the good one.
  MemorySink good(source->size_bytes()), slow_target;
  FaultSink slow(slow_target);
  slow.faults().SetDelay(FaultOp::kWrite, std::chrono::milliseconds(2500));
  RawDestination d0(good, {source->size_bytes()}), d1(slow, {source->size_bytes()});
  Destination* dests[] = {&d0, &d1};
  CopyOptions o = SmallOptions();
  o.failure_policy = DestinationFailurePolicy::kIsolate;
  o.stall_timeout = std::chrono::milliseconds(600);
  auto r = RunCopy(*source, WholeDisk(*source), dests, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(r->destinations[0].status.ok());
  ASSERT_FALSE(r->destinations[1].status.ok());
  EXPECT_NE(r->destinations[1].status.error().message().find("stalled"), std::string::npos);
  EXPECT_EQ(good.contents(), disk.bytes);
  // Only the write in progress when it stalled reached the slow sink.
  EXPECT_LE(slow.faults().calls(FaultOp::kWrite), 2u);
}

TEST(RunCopyTest, CancelBeforeStart) {
  TestDisk disk = MakeDisk();
  auto source = disk.Source();
  std::atomic<bool> cancel{true};
  CopyOptions o = SmallOptions();
  o.cancel = &cancel;
  auto r = RunCopy(*source, WholeDisk(*source), {}, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kCancelled);
}

TEST(RunCopyTest, CancelMidStream) {
  std::vector<std::byte> bytes = testing::RandomBytes(64 * kMiB, 5);
  MemorySource source(bytes);
  std::atomic<bool> cancel{false};
  uint64_t consumed = 0;
  HookDestination hook([&](const Chunk&) {
    if (++consumed == 3) cancel = true;
    return OkStatus();
  });
  Destination* dests[] = {&hook};
  auto pool = MakePool(6);
  CopyOptions o = SmallOptions();
  o.cancel = &cancel;
  o.pool = pool.get();
  auto r = RunCopy(source, WholeDisk(source), dests, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kCancelled);
  EXPECT_LT(consumed, 64u);
  EXPECT_EQ(pool->outstanding(), 0u);
}

TEST(RunCopyTest, MemoryBoundHoldsFor128MiBWith8MiB) {
  const uint64_t size = 128 * kMiB;
  std::vector<std::byte> bytes(size);
  for (uint64_t i = 0; i < size; i += 4096) bytes[i] = std::byte(1 + (i >> 12) % 251);
  MemorySource target(bytes);
  FaultSource source(target);  // counts read requests: one per chunk here
  CopyOptions o = SmallOptions();
  o.memory_bytes = 8 * kMiB;
  o.compression = formats::Compression::kNone;
  uint64_t consumed = 0;
  uint64_t max_ahead = 0;
  size_t capacity = PoolChunkCount(o.memory_bytes, o.chunk_bytes, false);
  HookDestination hook([&](const Chunk&) {
    // Chunks read but not yet consumed can never exceed the pool.
    uint64_t reads = source.faults().calls(FaultOp::kRead);
    max_ahead = std::max(max_ahead, reads - consumed);
    ++consumed;
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow writer
    return OkStatus();
  });
  MemorySink sink;
  RawDestination raw(sink, {size});
  Destination* dests[] = {&hook, &raw};
  auto r = RunCopy(source, WholeDisk(source), dests, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(consumed, 128u);
  EXPECT_EQ(r->pool_chunks, capacity);
  EXPECT_LE(r->pool_bytes, o.memory_bytes);
  EXPECT_LE(r->pool_high_water, r->pool_chunks);
  EXPECT_LE(max_ahead, r->pool_chunks);
  EXPECT_EQ(source.faults().calls(FaultOp::kRead), 128u);
  EXPECT_EQ(sink.contents(), bytes);
}

// Issue 12: RunCopy set a process-wide thread limit (global_control), so
// the parallel disk copies of a multi-disk VM backup clamped each other to
// the smallest --threads. Each copy runs in its own arena: a one-thread
// copy running alongside leaves the other its four threads. Seen from
// inside each copy's destination: the arena's concurrency, and how many
// Consume calls of the four-thread copy overlap.
TEST(RunCopyTest, ConcurrentCopiesDoNotClampEachOther) {
  TestDisk disk = MakeDisk();
  auto narrow_src = disk.Source();
  auto wide_src = disk.Source();
  std::atomic<bool> wide_done{false};
  std::atomic<int> narrow_arena{0}, wide_arena{0};

  // The narrow copy (1 thread) holds its first chunk until the wide copy
  // is done, so both run at once throughout.
  HookDestination narrow([&](const Chunk&) -> Status {
    narrow_arena = oneapi::tbb::this_task_arena::max_concurrency();
    for (int i = 0; i < 2000 && !wide_done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return OkStatus();
  });
  Result<CopyResult> narrow_result = Error::Cancelled("not run");
  std::atomic<bool> narrow_started{false};
  std::thread narrow_thread([&] {
    CopyOptions o = SmallOptions();
    o.threads = 1;
    Destination* dests[] = {&narrow};
    narrow_started = true;
    narrow_result = RunCopy(*narrow_src, WholeDisk(*narrow_src), dests, o);
  });
  while (!narrow_started || narrow_arena == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  // Parallel writes (one destination that needs no order), each slow
  // enough for others to start meanwhile.
  class Wide final : public Destination {
   public:
    explicit Wide(std::atomic<int>& arena) : arena_(arena) {}
    const std::string& name() const override { return name_; }
    bool concurrent_consume() const override { return true; }
    Status Consume(const Chunk&) override {
      arena_ = oneapi::tbb::this_task_arena::max_concurrency();
      int now = ++running_;
      int peak = peak_.load();
      while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      --running_;
      return OkStatus();
    }
    Status Finish() override { return OkStatus(); }
    int peak() const { return peak_; }

   private:
    std::atomic<int>& arena_;
    std::string name_ = "wide";
    std::atomic<int> running_{0}, peak_{0};
  } wide(wide_arena);
  CopyOptions o = SmallOptions();
  o.threads = 4;
  o.memory_bytes = 32 * kMiB;
  Destination* dests[] = {&wide};
  auto wide_result = RunCopy(*wide_src, WholeDisk(*wide_src), dests, o);
  wide_done = true;
  narrow_thread.join();
  ASSERT_TRUE(wide_result.ok()) << wide_result.error().ToString();
  ASSERT_TRUE(narrow_result.ok()) << narrow_result.error().ToString();
  EXPECT_EQ(narrow_arena.load(), 1);
  EXPECT_EQ(wide_arena.load(), 4);
  // With a process-wide limit of 1 only the calling thread would work.
  EXPECT_GE(wide.peak(), 3) << "the four-thread copy ran at most " << wide.peak() << " writes at once";
}

TEST(RunCopyTest, RejectsBadGeometry) {
  MemorySource source{std::vector<std::byte>(kMiB)};
  CopyOptions o = SmallOptions();
  o.chunk_bytes = kCluster + 1;
  EXPECT_EQ(RunCopy(source, WholeDisk(source), {}, o).error().code(), ErrorCode::kInvalidArgument);
  o = SmallOptions();
  o.cluster_bytes = 3000;
  EXPECT_EQ(RunCopy(source, WholeDisk(source), {}, o).error().code(), ErrorCode::kInvalidArgument);
}

TEST(RunCopyTest, EmptyWorkSetFinishesDestinations) {
  MemorySource source{std::vector<std::byte>(kMiB)};
  MemorySink sink;
  RawDestination dest(sink, {kMiB});
  Destination* dests[] = {&dest};
  auto r = RunCopy(source, {}, dests, SmallOptions());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->bytes_processed, 0u);
  EXPECT_EQ(sink.size_bytes(), kMiB);  // truncated to the virtual size
}

}  // namespace
}  // namespace barge::pipeline

namespace barge::pipeline {
namespace {

// Throughput of the graph alone (memory source, discarding destination).
// Run by hand: pipeline_test --gtest_also_run_disabled_tests
// --gtest_filter='*Throughput*'.
TEST(RunCopyBench, DISABLED_Throughput) {
  const uint64_t size = 512 * kMiB;
  // Half random, half mildly compressible, per 64 KiB cluster.
  std::vector<std::byte> bytes = testing::RandomBytes(size, 11);
  for (uint64_t c = 0; c < size; c += 2 * kCluster) {
    for (uint64_t i = 0; i < kCluster; ++i) bytes[c + i] = std::byte(((c + i) / 64) % 17 + (i % 5));
  }
  MemorySource source(std::move(bytes));
  class Null final : public Destination {
   public:
    explicit Null(formats::Compression c) : c_(c) {}
    const std::string& name() const override { return name_; }
    formats::Compression compression() const override { return c_; }
    Status Consume(const Chunk&) override { return OkStatus(); }
    Status Finish() override { return OkStatus(); }
    std::string name_ = "null";
    formats::Compression c_;
  };
  for (auto [label, comp, sha] : {std::tuple{"hash only", formats::Compression::kNone, false},
                                  std::tuple{"hash+sha512", formats::Compression::kNone, true},
                                  std::tuple{"hash+zstd3", formats::Compression::kZstd, false}}) {
    Null null(comp);
    Destination* dests[] = {&null};
    CopyOptions o;
    o.sha512 = sha;
    o.threads = 0;
    auto r = RunCopy(source, WholeDisk(source), dests, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    double secs = std::chrono::duration<double>(r->elapsed).count();
    std::printf("%-12s %8.1f MiB/s  (%llu compressed clusters, pool %zu chunks, peak %zu)\n", label,
                static_cast<double>(size) / kMiB / secs, static_cast<unsigned long long>(r->clusters.compressed),
                r->pool_chunks, r->pool_high_water);
  }
}

}  // namespace
}  // namespace barge::pipeline
