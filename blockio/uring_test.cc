// io_uring specifics: batches bigger than the ring, reads split into
// partial pieces that must be resubmitted, ring pool growth under many
// threads. The shared contract of both file paths is in file_test.cc.
#include <fcntl.h>

#include <thread>

#include "blockio/file_internal.h"
#include "tests/testing/testing.h"

namespace barge::internal {
namespace {

using ::barge::testing::RandomBytes;
using ::barge::testing::ReadFile;
using ::barge::testing::TempDir;
using ::barge::testing::WriteFile;

// A tiny ring and 4 KiB per SQE: a 1 MiB read needs 256 completions, each
// "short" relative to the request, so the remainder logic runs constantly.
constexpr UringTuning kTiny{.queue_depth = 4, .max_sqe_bytes = 4096};

std::unique_ptr<BlockSource> TinySource(const std::string& path) {
  auto fd = OpenFd(path, O_RDONLY, 0);
  EXPECT_TRUE(fd.ok());
  auto info = StatFd(*fd, path);
  EXPECT_TRUE(info.ok());
  auto source = MakeUringSource(path, *fd, *info, kTiny);
  EXPECT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_LT(fd->get(), 0) << "fd must move into the source on success";
  return std::move(source).value();
}

TEST(UringTest, PartialTransfersAreResubmitted) {
  TempDir dir;
  std::string path = dir / "disk.raw";
  auto data = RandomBytes((1 << 20) + 123, 1);
  WriteFile(path, data);
  auto source = TinySource(path);
  std::vector<std::byte> out(data.size() - 5);
  ASSERT_TRUE(source->ReadAt(5, out).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + 5));
}

TEST(UringTest, ReadManyLongerThanTheRing) {
  TempDir dir;
  std::string path = dir / "disk.raw";
  auto data = RandomBytes(1 << 20, 3);
  WriteFile(path, data);
  auto source = TinySource(path);
  std::vector<std::vector<std::byte>> bufs(50);
  std::vector<ReadRequest> reqs(bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) {
    bufs[i].resize(10000 + i);  // three SQEs each on the tiny ring
    reqs[i].offset = i * 20000;
    reqs[i].buffer = bufs[i];
  }
  ASSERT_TRUE(source->ReadMany(reqs).ok());
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_TRUE(reqs[i].status.ok());
    EXPECT_TRUE(std::equal(bufs[i].begin(), bufs[i].end(), data.begin() + reqs[i].offset)) << i;
  }
}

TEST(UringTest, ManyThreadsShareThePool) {
  TempDir dir;
  std::string path = dir / "disk.raw";
  auto data = RandomBytes(2 << 20, 4);
  WriteFile(path, data);
  auto source = TinySource(path);
  constexpr int kThreads = 16;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> buf(30000);
      for (int i = 0; i < 20; ++i) {
        uint64_t offset = (static_cast<uint64_t>(t) * 7919 + i * 104729) % (data.size() - buf.size());
        if (!source->ReadAt(offset, buf).ok() ||
            !std::equal(buf.begin(), buf.end(), data.begin() + offset)) {
          ++bad[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

TEST(UringTest, UnexpectedEndOfFileIsIoError) {
  // The file shrinks after open: size_bytes() still says 8192, so the read
  // passes the range check and meets EOF inside the ring.
  TempDir dir;
  std::string path = dir / "disk.raw";
  WriteFile(path, RandomBytes(8192, 5));
  auto source = TinySource(path);
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  std::vector<std::byte> out(8192);
  Status s = source->ReadAt(0, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kIoError);
  EXPECT_EQ(s.error().offset(), 4096u);
  EXPECT_EQ(s.error().path(), path);
}

}  // namespace
}  // namespace barge::internal
