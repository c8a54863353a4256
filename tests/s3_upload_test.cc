// The multipart upload sink (blockio/s3_upload.h) and the lock object
// (blockio/s3_lock.h) against a real Ceph radosgw (tests/testing/radosgw.h),
// cross-checked with a second client (aws s3) and qemu-img.
#include "blockio/s3_upload.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "blockio/s3_lock.h"
#include "formats/qcow2_writer.h"
#include "tests/testing/radosgw.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

using testing::Radosgw;

constexpr uint64_t kMiB = 1 << 20;

class S3UploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_RADOSGW(rgw_);
    HttpOptions o;
    o.s3.endpoint = rgw_->endpoint();
    o.s3.access_key_id = rgw_->access_key();
    o.s3.secret_access_key = rgw_->secret_key();
    o.max_attempts = 3;
    o.backoff_initial_ms = 50;
    auto c = S3Client::Create(o);
    ASSERT_TRUE(c.ok()) << c.error().ToString();
    client_ = std::move(*c);
    static std::atomic<int> n{0};
    bucket_ = "u" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    ASSERT_TRUE(client_->CreateBucket(bucket_).ok());
  }

  std::unique_ptr<S3Upload> Start(const std::string& key, S3UploadOptions options = {}) {
    auto up = S3Upload::Start(*client_, {bucket_, key}, options);
    EXPECT_TRUE(up.ok()) << up.error().ToString();
    return up.ok() ? std::move(*up) : nullptr;
  }

  std::vector<std::byte> Download(const std::string& key, uint64_t size) {
    std::vector<std::byte> out(size);
    for (uint64_t off = 0; off < size; off += 8 * kMiB) {  // a GET is at most 16 MiB
      Status st = client_->Get({bucket_, key}, off, std::span(out).subspan(off, std::min(8 * kMiB, size - off)));
      EXPECT_TRUE(st.ok()) << st.error().ToString();
    }
    return out;
  }

  size_t UploadsLeft() {
    auto left = client_->ListMultipartUploads({bucket_, ""});
    EXPECT_TRUE(left.ok());
    return left.ok() ? left->size() : 99;
  }

  Radosgw* rgw_ = nullptr;
  std::unique_ptr<S3Client> client_;
  std::string bucket_;
};

TEST_F(S3UploadTest, Qcow2WrittenThroughPartsPassesQemuImgCheckAndCompare) {
  BARGE_REQUIRE_TOOL("aws");
  BARGE_REQUIRE_TOOL("qemu-img");
  testing::TempDir dir;
  // 48 MiB guest: about 40 MiB of data, some zero clusters, some never written.
  const uint64_t virtual_size = 48 * kMiB;
  const uint32_t cluster = 65536;
  std::vector<std::byte> guest(virtual_size);
  const auto noise = testing::RandomBytes(virtual_size, 38);
  auto up = Start("disk.qcow2", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(up);
  formats::Qcow2WriterOptions wo;
  wo.virtual_size = virtual_size;
  wo.compression = formats::Compression::kNone;
  auto writer = formats::Qcow2Writer::Create(*up, wo);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  for (uint64_t i = 0; i < virtual_size / cluster; ++i) {
    if (i % 7 == 3) continue;  // unallocated
    if (i % 11 == 5) {
      ASSERT_TRUE((*writer)->WriteZero(i).ok());
      continue;
    }
    std::copy_n(noise.begin() + i * cluster, cluster, guest.begin() + i * cluster);
    ASSERT_TRUE((*writer)->WriteData(i, std::span(guest).subspan(i * cluster, cluster)).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  ASSERT_TRUE(up->Publish(/*if_absent=*/true).ok());
  EXPECT_GT(up->parts_sent(), 30);
  EXPECT_EQ(up->bytes_sent(), up->size_bytes());
  EXPECT_EQ(UploadsLeft(), 0u);
  const std::string raw = dir / "guest.raw", back = dir / "back.qcow2";
  testing::WriteFile(raw, guest);
  testing::RunOk(rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " s3 cp s3://" + bucket_ +
                 "/disk.qcow2 " + testing::ShellQuote(back) + " --only-show-errors");
  testing::RunOk("qemu-img check -q " + testing::ShellQuote(back));
  testing::RunOk("qemu-img compare -q -f raw -F qcow2 " + testing::ShellQuote(raw) + " " + testing::ShellQuote(back));
}

TEST_F(S3UploadTest, SmallObjectIsOnePutAndASecondIfAbsentIsBusy) {
  const auto first = testing::RandomBytes(1000, 1), second = testing::RandomBytes(1000, 2);
  auto a = Start("manifest.json");
  ASSERT_TRUE(a->WriteAt(0, first).ok());
  ASSERT_TRUE(a->Flush().ok());
  ASSERT_TRUE(a->Publish(true).ok());
  EXPECT_EQ(a->parts_sent(), 1);
  auto b = Start("manifest.json");
  ASSERT_TRUE(b->WriteAt(0, second).ok());
  Status st = b->Publish(true);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kBusy) << st.error().ToString();
  EXPECT_EQ(Download("manifest.json", first.size()), first);
  // A multipart object is checked the same way (HEAD before completing).
  auto c = Start("manifest.json", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(c->WriteAt(0, testing::RandomBytes(3 * kMiB, 3)).ok());
  st = c->Publish(true);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kBusy) << st.error().ToString();
  c.reset();
  EXPECT_EQ(Download("manifest.json", first.size()), first);
  EXPECT_EQ(UploadsLeft(), 0u);
}

TEST_F(S3UploadTest, UnpublishedUploadLeavesNothing) {
  auto a = Start("a.bin", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(a->WriteAt(0, testing::RandomBytes(4 * kMiB, 4)).ok());
  ASSERT_TRUE(a->Flush().ok());
  EXPECT_EQ(UploadsLeft(), 1u);
  EXPECT_GE(a->parts_sent(), 2);
  a.reset();  // destroyed unpublished
  EXPECT_EQ(UploadsLeft(), 0u);
  auto b = Start("b.bin", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(b->WriteAt(0, testing::RandomBytes(4 * kMiB, 5)).ok());
  ASSERT_TRUE(b->Abort().ok());
  EXPECT_EQ(UploadsLeft(), 0u);
  EXPECT_FALSE(b->WriteAt(4 * kMiB, testing::RandomBytes(10, 5)).ok());
  EXPECT_FALSE(b->Publish(false).ok());
  for (const char* key : {"a.bin", "b.bin"}) {
    auto head = client_->Head({bucket_, key});
    ASSERT_FALSE(head.ok());
    EXPECT_EQ(head.error().code(), ErrorCode::kNotFound);
  }
}

TEST_F(S3UploadTest, FailedPartIsReturnedAndTheUploadAborted) {
  auto up = Start("x.bin", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(up->WriteAt(0, testing::RandomBytes(3 * kMiB, 13)).ok());
  ASSERT_TRUE(up->Flush().ok());
  // Another client aborts the upload: the next parts fail (NoSuchUpload).
  auto uploads = client_->ListMultipartUploads({bucket_, ""});
  ASSERT_TRUE(uploads.ok());
  ASSERT_EQ(uploads->size(), 1u);
  ASSERT_TRUE(client_->AbortMultipart({bucket_, "x.bin"}, uploads->front().upload_id).ok());
  Status st = up->WriteAt(3 * kMiB, testing::RandomBytes(3 * kMiB, 14));
  if (st.ok()) st = up->Flush();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kNotFound) << st.error().ToString();
  EXPECT_NE(st.error().ToString().find("uploading part"), std::string::npos) << st.error().ToString();
  EXPECT_FALSE(up->WriteAt(6 * kMiB, testing::RandomBytes(10, 15)).ok()) << "every later call fails";
  EXPECT_FALSE(up->Publish(false).ok());
  EXPECT_EQ(UploadsLeft(), 0u);
  EXPECT_FALSE(client_->Head({bucket_, "x.bin"}).ok());
}

TEST_F(S3UploadTest, WriteBehindTheSentFrontierIsNotSupported) {
  auto up = Start("f.bin", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(up->WriteAt(0, testing::RandomBytes(3 * kMiB + 10, 6)).ok());
  Status st = up->WriteAt(kMiB + 100, testing::RandomBytes(10, 7));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kNotSupported);
  EXPECT_NE(st.error().ToString().find("front to back"), std::string::npos) << st.error().ToString();
  EXPECT_NE(st.error().ToString().find("s3://" + bucket_ + "/f.bin"), std::string::npos) << st.error().ToString();
  EXPECT_EQ(up->Truncate(kMiB).error().code(), ErrorCode::kNotSupported);
  // The front part and the part filling still take writes (a header last).
  const auto header = testing::RandomBytes(512, 8);
  ASSERT_TRUE(up->WriteAt(0, header).ok());
  ASSERT_TRUE(up->WriteAt(3 * kMiB, testing::RandomBytes(10, 9)).ok());
  ASSERT_TRUE(up->Publish(false).ok());
  auto got = Download("f.bin", 512);
  EXPECT_EQ(got, header);
}

TEST_F(S3UploadTest, SmallMemoryBudgetStillCompletesWithEveryPart) {
  // Budget: the front and two parts; parts of 1 MiB, 20 of them.
  auto up = Start("m.bin", S3UploadOptions{.memory_bytes = 3 * kMiB, .parts_in_flight = 2, .test_part_bytes = kMiB});
  const auto data = testing::RandomBytes(20 * kMiB - 1000, 10);
  for (uint64_t off = 0; off < data.size(); off += 256 * 1024) {
    const size_t n = std::min<size_t>(256 * 1024, data.size() - off);
    ASSERT_TRUE(up->WriteAt(off, std::span(data).subspan(off, n)).ok());
  }
  ASSERT_TRUE(up->Publish(false).ok());
  EXPECT_EQ(up->parts_sent(), 20);
  EXPECT_EQ(up->bytes_sent(), data.size());
  EXPECT_EQ(Download("m.bin", data.size()), data);
}

TEST_F(S3UploadTest, GapsReadAsZerosAndTruncateSetsTheSize) {
  auto up = Start("g.bin", S3UploadOptions{.test_part_bytes = kMiB});
  const auto a = testing::RandomBytes(100, 11), b = testing::RandomBytes(100, 12);
  ASSERT_TRUE(up->WriteAt(10, a).ok());
  ASSERT_TRUE(up->WriteAt(5 * kMiB + 7, b).ok());  // skips parts 2..5
  ASSERT_TRUE(up->Truncate(6 * kMiB + 1).ok());
  ASSERT_TRUE(up->Publish(false).ok());
  std::vector<std::byte> want(6 * kMiB + 1);
  std::copy(a.begin(), a.end(), want.begin() + 10);
  std::copy(b.begin(), b.end(), want.begin() + 5 * kMiB + 7);
  EXPECT_EQ(Download("g.bin", want.size()), want);
  auto head = client_->Head({bucket_, "g.bin"});
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->size, want.size());
}

// A run killed mid-upload (Keep: the store keeps the upload, as after a
// SIGKILL) and the next run continuing it from its journal: only the
// front part and what was not sent go again, and the object is whole.
TEST_F(S3UploadTest, KeptUploadContinuesFromItsJournaledParts) {
  const auto data = testing::RandomBytes(10 * kMiB + 300, 20);
  auto first = Start("r.bin", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(first->WriteAt(0, std::span(data).subspan(0, 6 * kMiB + 512 * 1024)).ok());
  ASSERT_TRUE(first->Flush().ok());
  const S3UploadJournal journal = first->Journal();
  ASSERT_FALSE(journal.upload_id.empty());
  ASSERT_EQ(journal.parts.size(), 5u);  // parts 2..6; 7 is filling, the front held
  EXPECT_EQ(journal.end(), 6 * kMiB);
  ASSERT_TRUE(first->Keep().ok());
  EXPECT_FALSE(first->WriteAt(7 * kMiB, testing::RandomBytes(10, 21)).ok());
  first.reset();
  EXPECT_EQ(UploadsLeft(), 1u) << "a kept upload stays for the next run";

  auto next = S3Upload::Continue(*client_, {bucket_, "r.bin"}, journal);
  ASSERT_TRUE(next.ok()) << next.error().ToString();
  S3Upload& up = **next;
  EXPECT_EQ(up.kept_end(), 6 * kMiB);
  EXPECT_EQ(up.dropped_parts(), 0u);
  // The kept parts are sent: a write there is behind the frontier.
  EXPECT_EQ(up.WriteAt(3 * kMiB, testing::RandomBytes(10, 22)).error().code(), ErrorCode::kNotSupported);
  ASSERT_TRUE(up.WriteAt(6 * kMiB, std::span(data).subspan(6 * kMiB)).ok());
  ASSERT_TRUE(up.WriteAt(0, std::span(data).subspan(0, kMiB)).ok());  // the front, written again
  ASSERT_TRUE(up.Publish(/*if_absent=*/true).ok());
  EXPECT_EQ(up.bytes_sent(), data.size() - 5 * kMiB) << "the kept 5 MiB are not sent again";
  EXPECT_EQ(Download("r.bin", data.size()), data);
  EXPECT_EQ(UploadsLeft(), 0u);
  // Completed: the journal's upload is gone.
  auto again = S3Upload::Continue(*client_, {bucket_, "r.bin"}, journal);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kNotFound) << again.error().ToString();
}

// A part replaced in the store since it was journaled ends what is kept:
// the parts from it on go again, and the object is still the data written.
TEST_F(S3UploadTest, ContinueKeepsOnlyThePartsThatStillMatch) {
  const auto data = testing::RandomBytes(8 * kMiB, 23);
  auto first = Start("p.bin", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(first->WriteAt(0, std::span(data).subspan(0, 6 * kMiB + 10)).ok());
  ASSERT_TRUE(first->Flush().ok());
  const S3UploadJournal journal = first->Journal();
  ASSERT_EQ(journal.parts.size(), 5u);
  ASSERT_TRUE(first->Keep().ok());
  first.reset();
  ASSERT_TRUE(client_->UploadPart({bucket_, "p.bin"}, journal.upload_id, 4, testing::RandomBytes(kMiB, 24)).ok());

  auto next = S3Upload::Continue(*client_, {bucket_, "p.bin"}, journal);
  ASSERT_TRUE(next.ok()) << next.error().ToString();
  S3Upload& up = **next;
  EXPECT_EQ(up.kept_end(), 3 * kMiB);  // parts 2 and 3
  EXPECT_EQ(up.dropped_parts(), 3u);
  EXPECT_NE(up.dropped_reason().find("part 4 was replaced"), std::string::npos) << up.dropped_reason();
  ASSERT_TRUE(up.WriteAt(3 * kMiB, std::span(data).subspan(3 * kMiB)).ok());
  ASSERT_TRUE(up.WriteAt(0, std::span(data).subspan(0, kMiB)).ok());
  ASSERT_TRUE(up.Publish(false).ok());
  EXPECT_EQ(Download("p.bin", data.size()), data);
  EXPECT_EQ(UploadsLeft(), 0u);
}

// An upload someone aborted is "gone" (kNotFound): the caller starts over.
TEST_F(S3UploadTest, ContinueOfAnAbortedUploadIsNotFound) {
  auto first = Start("a2.bin", S3UploadOptions{.test_part_bytes = kMiB});
  ASSERT_TRUE(first->WriteAt(0, testing::RandomBytes(3 * kMiB + 10, 25)).ok());
  ASSERT_TRUE(first->Flush().ok());
  const S3UploadJournal journal = first->Journal();
  ASSERT_TRUE(first->Keep().ok());
  first.reset();
  ASSERT_TRUE(client_->AbortMultipart({bucket_, "a2.bin"}, journal.upload_id).ok());
  auto next = S3Upload::Continue(*client_, {bucket_, "a2.bin"}, journal);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error().code(), ErrorCode::kNotFound) << next.error().ToString();
  EXPECT_EQ(UploadsLeft(), 0u);
}

std::vector<std::byte> Bytes(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

TEST_F(S3UploadTest, LockIsOneHolderAtATime) {
  const S3Location at{bucket_, "chain/.lock"};
  auto first = S3Lock::Acquire(*client_, at);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  EXPECT_FALSE((*first)->took_over());
  auto second = S3Lock::Acquire(*client_, at, S3LockOptions{.busy_message = "the chain is being written"});
  ASSERT_FALSE(second.ok());
  const std::string line = second.error().ToString();
  EXPECT_EQ(second.error().code(), ErrorCode::kBusy) << line;
  EXPECT_NE(line.find("the chain is being written: held by host "), std::string::npos) << line;
  EXPECT_NE(line.find("pid " + std::to_string(::getpid()) + " until "), std::string::npos) << line;
  EXPECT_NE(line.find(at.shown()), std::string::npos) << line;
  first->reset();
  auto head = client_->Head(at);
  EXPECT_FALSE(head.ok()) << "the destructor deletes the lock";
  auto third = S3Lock::Acquire(*client_, at);
  ASSERT_TRUE(third.ok()) << third.error().ToString();
}

TEST_F(S3UploadTest, WaitingAcquireGetsTheLockOnceLetGo) {
  const S3Location at{bucket_, ".lock"};
  auto first = S3Lock::Acquire(*client_, at);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    first->reset();
  });
  const auto start = std::chrono::steady_clock::now();
  auto second = S3Lock::Acquire(*client_, at, S3LockOptions{.wait = true});
  release.join();
  ASSERT_TRUE(second.ok()) << second.error().ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_FALSE((*second)->took_over());
}

TEST_F(S3UploadTest, ExpiredLockIsTakenOver) {
  const S3Location at{bucket_, ".lock"};
  S3LockBody dead{"deadhost", 4242, std::string(32, 'a'), 1000, 2000, "", 0};
  ASSERT_TRUE(client_->Put(at, Bytes(FormatS3LockBody(dead))).ok());
  auto lock = S3Lock::Acquire(*client_, at);
  ASSERT_TRUE(lock.ok()) << lock.error().ToString();
  EXPECT_TRUE((*lock)->took_over());
  EXPECT_EQ((*lock)->previous_owner(), "host deadhost pid 4242");
  auto again = S3Lock::Acquire(*client_, at);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kBusy);
}

// A lock of a process of this machine that is gone (a SIGKILLed run) is
// taken over at once, unexpired; a live owner's is not.
TEST_F(S3UploadTest, DeadOwnersLockOnThisMachineIsTakenOverAtOnce) {
  const S3Location at{bucket_, ".lock"};
  auto mine = S3Lock::Acquire(*client_, at);
  ASSERT_TRUE(mine.ok()) << mine.error().ToString();
  std::vector<std::byte> bytes(client_->Head(at)->size);
  ASSERT_TRUE(client_->Get(at, 0, bytes).ok());
  auto body = ParseS3LockBody(bytes, at);
  ASSERT_TRUE(body.ok()) << body.error().ToString();
  ASSERT_FALSE(body->boot.empty()) << "no boot id or pid namespace here";
  EXPECT_EQ(body->pid, ::getpid());
  EXPECT_GT(body->start, 0);
  // A live owner (this process): busy, unexpired.
  auto other = S3Lock::Acquire(*client_, at);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code(), ErrorCode::kBusy) << other.error().ToString();
  mine->reset();
  // The same owner with a start time that is not this process's: its pid
  // was reused, the owner is gone.
  S3LockBody reused = *body;
  reused.start += 1;
  ASSERT_TRUE(client_->Put(at, Bytes(FormatS3LockBody(reused))).ok());
  auto taken = S3Lock::Acquire(*client_, at);
  ASSERT_TRUE(taken.ok()) << taken.error().ToString();
  EXPECT_TRUE((*taken)->took_over());
  EXPECT_EQ((*taken)->takeover_reason(), "dead");
  taken->reset();
  // Another machine's lock (another boot) waits for its expiry.
  S3LockBody elsewhere = *body;
  elsewhere.boot = "00000000-0000-0000-0000-000000000000/1";
  elsewhere.start += 1;
  ASSERT_TRUE(client_->Put(at, Bytes(FormatS3LockBody(elsewhere))).ok());
  auto waits = S3Lock::Acquire(*client_, at);
  ASSERT_FALSE(waits.ok());
  EXPECT_EQ(waits.error().code(), ErrorCode::kBusy);
}

// The takeover's replace is conditional: a PUT with an ETag that is no
// longer the object's is refused (two takers: one wins).
TEST_F(S3UploadTest, PutIfMatchRefusesAnotherVersion) {
  const S3Location at{bucket_, "k"};
  ASSERT_TRUE(client_->Put(at, Bytes("one")).ok());
  auto first = client_->Head(at);
  ASSERT_TRUE(first.ok());
  Status matched = client_->PutIfMatch(at, Bytes("two"), first->etag);
  ASSERT_TRUE(matched.ok()) << matched.error().ToString();
  Status stale = client_->PutIfMatch(at, Bytes("three"), first->etag);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), ErrorCode::kBusy) << stale.error().ToString();
  std::vector<std::byte> now(3);
  ASSERT_TRUE(client_->Get(at, 0, now).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(now.data()), 3), "two");
}

// A copy above the single-copy limit goes in UploadPartCopy parts (forced
// here with a few MiB) and equals its source, byte for byte, as a second
// client downloads it. DISABLED: against radosgw every UploadPartCopy is
// 403 SignatureDoesNotMatch with Debian 12's curl 7.88 (seemingly its
// SigV4 sorts "name:value" lines, putting x-amz-copy-source-range before
// x-amz-copy-source; fixed in later curls, unconfirmed).
TEST_F(S3UploadTest, DISABLED_CopyAboveTheLimitGoesInPartsAndEqualsTheSource) {
  BARGE_REQUIRE_TOOL("aws");
  testing::TempDir dir;
  const auto data = testing::RandomBytes(12 * kMiB + 12345, 77);
  testing::WriteFile(dir / "src", data);
  ASSERT_TRUE(client_->Put({bucket_, "src"}, data).ok());
  client_->set_copy_limits({.single_max = 4 * kMiB, .part_bytes = 5 * kMiB});
  Status copied = client_->Copy({bucket_, "src"}, {bucket_, "dst"});
  ASSERT_TRUE(copied.ok()) << copied.error().ToString();
  auto head = client_->Head({bucket_, "dst"});
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->size, data.size());
  EXPECT_NE(head->etag.find("-3"), std::string::npos) << "three parts: " << head->etag;
  EXPECT_EQ(UploadsLeft(), 0u);
  testing::RunOk(rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " s3 cp s3://" + bucket_ +
                 "/dst " + testing::ShellQuote(dir / "dst") + " >/dev/null");
  testing::RunOk("cmp " + testing::ShellQuote(dir / "src") + " " + testing::ShellQuote(dir / "dst"));
  // Under the limit: one CopyObject (no part suffix on the ETag).
  client_->set_copy_limits({});
  ASSERT_TRUE(client_->Copy({bucket_, "src"}, {bucket_, "one"}).ok());
  auto single = client_->Head({bucket_, "one"});
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->etag.find('-'), std::string::npos) << single->etag;
}

TEST_F(S3UploadTest, RenewalKeepsALockAlivePastItsTtl) {
  const S3Location at{bucket_, ".lock"};
  auto lock = S3Lock::Acquire(*client_, at, S3LockOptions{.ttl = std::chrono::seconds(3)});
  ASSERT_TRUE(lock.ok()) << lock.error().ToString();
  std::this_thread::sleep_for(std::chrono::seconds(5));
  auto other = S3Lock::Acquire(*client_, at, S3LockOptions{.ttl = std::chrono::seconds(3)});
  ASSERT_FALSE(other.ok()) << "renewed, so not expired";
  EXPECT_EQ(other.error().code(), ErrorCode::kBusy) << other.error().ToString();
  EXPECT_FALSE((*lock)->lost());
  // A lock replaced under us is noticed at the next renewal.
  S3LockBody thief{"thief", 1, std::string(32, 'b'), 1000, 9999999999, "", 0};
  ASSERT_TRUE(client_->Put(at, Bytes(FormatS3LockBody(thief))).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_TRUE((*lock)->lost());
  lock->reset();
  auto head = client_->Head(at);
  EXPECT_TRUE(head.ok()) << "another's lock is not deleted";
}

TEST_F(S3UploadTest, GarbageLockBodyIsAClearError) {
  const S3Location at{bucket_, ".lock"};
  ASSERT_TRUE(client_->Put(at, Bytes("not json at all")).ok());
  auto lock = S3Lock::Acquire(*client_, at);
  ASSERT_FALSE(lock.ok());
  const std::string line = lock.error().ToString();
  EXPECT_EQ(lock.error().code(), ErrorCode::kInvalidArgument) << line;
  EXPECT_NE(line.find("a lock object barge did not write"), std::string::npos) << line;
  EXPECT_NE(line.find(at.shown()), std::string::npos) << line;
}

}  // namespace
}  // namespace barge
