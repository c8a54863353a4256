// EncryptingSink and DecryptingSource over memory: round trips at odd
// sizes, ranged reads across segment boundaries, the qcow2 writer's
// pattern (appends, then the header at 0), tampering, reordering,
// truncation, wrong keys, and what the ciphertext does not show.
#include "blockio/aead_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <cstring>

#include "blockio/env.h"
#include "blockio/memory.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

constexpr uint32_t kSeg = 4096;

EncryptionKey KeyOf(uint8_t fill) {
  std::array<uint8_t, kKekBytes> raw{};
  raw.fill(fill);
  return EncryptionKey::FromRawKey(raw);
}

EncryptingSinkOptions Small() {
  EncryptingSinkOptions o;
  o.segment_bytes = kSeg;
  o.rewritable_front_bytes = 2 * kSeg;
  return o;
}

// `plain` written through an EncryptingSink in `chunk`-byte writes, flushed.
std::vector<std::byte> Encrypt(const std::vector<std::byte>& plain, size_t chunk, const std::string& identity = "b/k",
                               EncryptingSinkOptions options = Small()) {
  MemorySink target(0, "s3://b/k");
  auto sink = EncryptingSink::Create(target, KeyOf(1), identity, options);
  EXPECT_TRUE(sink.ok());
  for (size_t at = 0; at < plain.size(); at += chunk) {
    const size_t n = std::min(chunk, plain.size() - at);
    EXPECT_TRUE((*sink)->WriteAt(at, std::span(plain).subspan(at, n)).ok());
  }
  EXPECT_TRUE((*sink)->Flush().ok());
  EXPECT_EQ((*sink)->size_bytes(), plain.size());
  return target.contents();
}

Result<std::unique_ptr<DecryptingSource>> Decrypt(std::vector<std::byte> object, const EncryptionKey& key,
                                                  const std::string& identity = "b/k") {
  return DecryptingSource::Open(std::make_unique<MemorySource>(std::move(object), "s3://b/k"), key, identity);
}

std::vector<std::byte> ReadAll(BlockSource& source) {
  std::vector<std::byte> out(source.size_bytes());
  EXPECT_TRUE(source.ReadAt(0, out).ok());
  return out;
}

TEST(AeadStreamTest, RoundTripsOddSizesAndChunks) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{kSeg - 1}, size_t{kSeg}, size_t{kSeg + 1}, size_t{3 * kSeg},
                      size_t{10 * kSeg + 777}}) {
    for (size_t chunk : {size_t{1000}, size_t{kSeg}, size_t{5 * kSeg + 3}}) {
      const auto plain = testing::RandomBytes(size, size + chunk);
      const auto object = Encrypt(plain, chunk);
      EXPECT_EQ(object.size(), AeadLayout{kSeg}.ObjectBytes(size));
      auto source = Decrypt(object, KeyOf(1));
      ASSERT_TRUE(source.ok()) << size << " " << source.error().ToString();
      EXPECT_EQ((*source)->size_bytes(), size);
      EXPECT_TRUE(ReadAll(**source) == plain) << size << " in chunks of " << chunk;
    }
  }
}

TEST(AeadStreamTest, RangedReadsAtSegmentBoundaries) {
  const auto plain = testing::RandomBytes(7 * kSeg + 100, 9);
  auto source = Decrypt(Encrypt(plain, 3000), KeyOf(1));
  ASSERT_TRUE(source.ok());
  for (uint64_t offset : {0ul, 1ul, kSeg - 1ul, 1ul * kSeg, kSeg + 1ul, 3ul * kSeg - 5, 7ul * kSeg, 7ul * kSeg + 99}) {
    for (uint64_t length : {1ul, 5ul, 1ul * kSeg, kSeg + 10ul, 3ul * kSeg}) {
      if (offset + length > plain.size()) continue;
      std::vector<std::byte> out(length);
      ASSERT_TRUE((*source)->ReadAt(offset, out).ok()) << offset << "+" << length;
      EXPECT_TRUE(std::equal(out.begin(), out.end(), plain.begin() + offset)) << offset << "+" << length;
    }
  }
  std::vector<std::byte> past(2);
  EXPECT_EQ((*source)->ReadAt(plain.size() - 1, past).error().code(), ErrorCode::kInvalidArgument);
}

TEST(AeadStreamTest, FrontRewritesGapsAndWritesAfterAFlush) {
  // The qcow2 writer's pattern: appends with skipped zero blocks, then the
  // header at 0; then more data after a first flush.
  auto plain = testing::RandomBytes(9 * kSeg + 10, 4);
  std::fill(plain.begin() + 3 * kSeg, plain.begin() + 5 * kSeg + 7, std::byte{0});
  MemorySink target;
  auto sink = EncryptingSink::Create(target, KeyOf(1), "b/k", Small());
  ASSERT_TRUE(sink.ok());
  ASSERT_TRUE((*sink)->WriteAt(100, std::span(plain).subspan(100, 3 * kSeg - 100)).ok());
  ASSERT_TRUE((*sink)->WriteAt(5 * kSeg + 7, std::span(plain).subspan(5 * kSeg + 7, kSeg)).ok());
  ASSERT_TRUE((*sink)->Flush().ok());
  ASSERT_TRUE((*sink)->WriteAt(6 * kSeg + 7, std::span(plain).subspan(6 * kSeg + 7, 3 * kSeg + 3)).ok());
  ASSERT_TRUE((*sink)->WriteAt(0, std::span(plain).first(100)).ok());  // "the header"
  ASSERT_TRUE((*sink)->Flush().ok());
  auto source = Decrypt(target.contents(), KeyOf(1));
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_TRUE(ReadAll(**source) == plain);

  // A segment past the front that is sealed cannot be written again.
  auto again = (*sink)->WriteAt(3 * kSeg, std::span(plain).first(10));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kNotSupported);
  EXPECT_NE(again.error().message().find("segment 3 (plaintext offset 12288)"), std::string::npos)
      << again.error().message();
}

TEST(AeadStreamTest, RoundTripsThroughRealFiles) {
  // The file backends (io_uring reads, a growing file sink) under the layer.
  testing::TempDir dir;
  const std::string path = dir / "object.enc";
  const auto plain = testing::RandomBytes(3 * kAeadDefaultSegmentBytes + 12345, 21);
  {
    auto file = Env::Default().OpenSink(path, SinkMode::kCreateNew);
    ASSERT_TRUE(file.ok()) << file.error().ToString();
    auto sink = EncryptingSink::Create(**file, KeyOf(1), path, {});
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE((*sink)->WriteAt(0, plain).ok());
    ASSERT_TRUE((*sink)->Flush().ok());
  }
  auto file = Env::Default().OpenSource(path);
  ASSERT_TRUE(file.ok()) << file.error().ToString();
  auto source = DecryptingSource::Open(std::move(file).value(), KeyOf(1), path);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_TRUE(ReadAll(**source) == plain);
  std::vector<std::byte> out(100);
  ASSERT_TRUE((*source)->ReadAt(kAeadDefaultSegmentBytes - 50, out).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), plain.begin() + kAeadDefaultSegmentBytes - 50));
}

TEST(AeadStreamTest, WrongKeyAndWrongIdentity) {
  const auto object = Encrypt(testing::RandomBytes(5000, 1), 5000);
  auto wrong = Decrypt(object, KeyOf(2));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(wrong.error().path(), "s3://b/k");
  EXPECT_NE(wrong.error().message().find("wrong key: the data key does not unwrap with key "), std::string::npos);
  // The same key under another name: the segments do not open.
  auto moved = Decrypt(object, KeyOf(1), "b/other");
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.error().code(), ErrorCode::kCorruption);
  auto plain = Decrypt(testing::RandomBytes(5000, 2), KeyOf(1));
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.error().message(), "not a barge encrypted object");
}

TEST(AeadStreamTest, FlippedByteInSegmentFiveNamesItsOffset) {
  const auto plain = testing::RandomBytes(8 * kSeg, 3);
  auto object = Encrypt(plain, kSeg);
  object[AeadLayout{kSeg}.SegmentOffset(5) + 100] ^= std::byte{1};
  auto source = Decrypt(object, KeyOf(1));
  ASSERT_TRUE(source.ok());  // only the last segment is checked at open
  std::vector<std::byte> out(10);
  EXPECT_TRUE((*source)->ReadAt(4 * kSeg, out).ok());
  auto bad = (*source)->ReadAt(5 * kSeg + 7, out);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(bad.error().path(), "s3://b/k");
  EXPECT_EQ(bad.error().offset(), 5u * kSeg);
  EXPECT_NE(bad.error().message().find("segment 5 at plaintext offset 20480"), std::string::npos)
      << bad.error().message();
}

TEST(AeadStreamTest, SwappedSegmentsAndTruncationAreCorruption) {
  const AeadLayout l{kSeg};
  const auto plain = testing::RandomBytes(6 * kSeg + 50, 8);
  const auto object = Encrypt(plain, kSeg);

  auto swapped = object;
  const size_t whole = kSeg + kAeadSegmentOverhead;
  std::swap_ranges(swapped.begin() + l.SegmentOffset(1), swapped.begin() + l.SegmentOffset(1) + whole,
                   swapped.begin() + l.SegmentOffset(2));
  auto s = Decrypt(swapped, KeyOf(1));
  ASSERT_TRUE(s.ok());
  std::vector<std::byte> out(kSeg);
  EXPECT_EQ((*s)->ReadAt(kSeg, out).error().code(), ErrorCode::kCorruption);
  EXPECT_EQ((*s)->ReadAt(2 * kSeg, out).error().code(), ErrorCode::kCorruption);

  // Cut to whole segments: the size no longer matches the header ...
  auto cut = object;
  cut.resize(l.SegmentOffset(4));
  auto c = Decrypt(cut, KeyOf(1));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), ErrorCode::kCorruption);
  // ... and with the header's size edited to match, the new last segment
  // was not sealed as the final one.
  auto edited = cut;
  const uint64_t size = 4 * kSeg;
  for (int i = 0; i < 8; ++i) edited[16 + i] = std::byte(size >> (8 * i));
  auto e = Decrypt(edited, KeyOf(1));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), ErrorCode::kCorruption);
  EXPECT_NE(e.error().message().find("segment 3"), std::string::npos) << e.error().message();
  // A few bytes cut off the end.
  auto short_tail = object;
  short_tail.resize(object.size() - 3);
  EXPECT_EQ(Decrypt(short_tail, KeyOf(1)).error().code(), ErrorCode::kCorruption);
}

TEST(AeadStreamTest, CiphertextHoldsNoKnownPlaintext) {
  const std::string marker = "BARGE-KNOWN-PLAINTEXT-MARKER-0123456789";
  std::vector<std::byte> plain(20 * kSeg);
  for (size_t at = 0; at + marker.size() <= plain.size(); at += 1000) {
    std::memcpy(plain.data() + at, marker.data(), marker.size());
  }
  const auto object = Encrypt(plain, 65536);
  const std::string_view text(reinterpret_cast<const char*>(object.data()), object.size());
  EXPECT_EQ(text.find(marker.substr(0, 12)), std::string_view::npos);
  // Zeros do not show either: no run of 64 zero bytes past the header.
  EXPECT_EQ(text.substr(kAeadHeaderBytes).find(std::string(64, '\0')), std::string_view::npos);
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

// Forwards writes to a memory sink; Flush is free (MemorySink's copies the
// whole contents, which would dwarf the cipher in a measurement).
class FreeFlushSink final : public BlockSink {
 public:
  explicit FreeFlushSink(MemorySink& target) : target_(target) {}
  const std::string& name() const override { return target_.name(); }
  uint64_t size_bytes() const override { return target_.size_bytes(); }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override { return target_.WriteAt(offset, data); }
  Status Flush() override { return OkStatus(); }

 private:
  MemorySink& target_;
};

// Throughput on this machine, for docs/formats/encryption.md (printed; no
// assertion on speed). CPU time of this thread, so that other work on a
// shared machine does not count.
TEST(AeadStreamTest, MeasuresThroughput) {
  const auto plain = testing::RandomBytes(64 << 20, 11);
  MemorySink target;
  ASSERT_TRUE(target.WriteAt(AeadLayout{kAeadDefaultSegmentBytes}.ObjectBytes(plain.size()) - 1,
                             std::span(plain).first(1)).ok());  // memory in place before timing
  FreeFlushSink free_flush(target);
  auto sink = EncryptingSink::Create(free_flush, KeyOf(1), "bench", {});
  ASSERT_TRUE(sink.ok());
  const double t0 = ThreadCpuSeconds();
  for (size_t at = 0; at < plain.size(); at += 1 << 20) {
    ASSERT_TRUE((*sink)->WriteAt(at, std::span(plain).subspan(at, 1 << 20)).ok());
  }
  ASSERT_TRUE((*sink)->Flush().ok());
  const double encrypt = ThreadCpuSeconds() - t0;
  auto source = DecryptingSource::Open(target.ToSource(), KeyOf(1), "bench");
  ASSERT_TRUE(source.ok());
  const double t1 = ThreadCpuSeconds();
  std::vector<std::byte> out(1 << 20);
  for (size_t at = 0; at < plain.size(); at += out.size()) ASSERT_TRUE((*source)->ReadAt(at, out).ok());
  const double t2 = ThreadCpuSeconds();
  const double mib = double(plain.size()) / (1 << 20);
  auto rate = [&](double a, double b) { return mib / (b - a); };
  std::printf("AEAD 64 KiB segments, 1 MiB requests: encrypt %.0f MiB/s, decrypt %.0f MiB/s "
              "(memory to memory, CPU time of one thread)\n",
              mib / encrypt, rate(t1, t2));
}

}  // namespace
}  // namespace barge
