// Tests of the file backends, run once with io_uring reads and once with
// pread (FileOptions::use_uring), so both paths keep the same contract.
#include "blockio/file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "blockio/file_internal.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

using ::barge::testing::RandomBytes;
using ::barge::testing::ReadFile;
using ::barge::testing::TempDir;
using ::barge::testing::WriteFile;

class FileBackendTest : public ::testing::TestWithParam<bool> {
 protected:
  FileOptions options() const {
    FileOptions o;
    o.use_uring = GetParam();
    return o;
  }
  std::unique_ptr<BlockSource> Source(const std::string& path) {
    auto s = OpenFileSource(path, options());
    EXPECT_TRUE(s.ok()) << s.error().ToString();
    EXPECT_EQ(internal::IsUringBacked(**s), GetParam());
    return std::move(s).value();
  }
  std::unique_ptr<BlockSink> Sink(const std::string& path, SinkMode mode) {
    auto s = OpenFileSink(path, mode, options());
    EXPECT_TRUE(s.ok()) << s.error().ToString();
    return std::move(s).value();
  }
  TempDir dir_;
};

TEST_P(FileBackendTest, WriteThenReadRoundTrip) {
  std::string path = dir_ / "disk.raw";
  auto data = RandomBytes(3 * 1024 * 1024 + 777, 1);  // large and unaligned
  {
    auto sink = Sink(path, SinkMode::kCreateNew);
    ASSERT_TRUE(sink->WriteAt(0, std::span(data).first(1000)).ok());
    ASSERT_TRUE(sink->WriteAt(1000, std::span(data).subspan(1000)).ok());
    EXPECT_EQ(sink->size_bytes(), data.size());
    ASSERT_TRUE(sink->Flush().ok());
  }
  EXPECT_EQ(ReadFile(path), data);

  auto source = Source(path);
  EXPECT_EQ(source->size_bytes(), data.size());
  std::vector<std::byte> out(data.size());
  ASSERT_TRUE(source->ReadAt(0, out).ok());
  EXPECT_EQ(out, data);
  std::vector<std::byte> part(12345);
  ASSERT_TRUE(source->ReadAt(4097, part).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), data.begin() + 4097));
}

// Pages of [offset, offset+length) of `path` resident in the page cache.
size_t ResidentPages(const std::string& path, size_t length) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((length + page - 1) / page);
  size_t resident = 0;
  if (::mincore(map, length, vec.data()) == 0) {
    for (unsigned char v : vec) resident += v & 1;
  }
  ::munmap(map, length);
  return resident;
}

TEST_P(FileBackendTest, WriteBehindDropsWrittenPagesFromTheCache) {
  // tmpfs keeps its pages whatever we advise; write-behind needs a real
  // filesystem to show.
  struct statfs fs_info {};
  ASSERT_EQ(::statfs(dir_.path().c_str(), &fs_info), 0);
  if (fs_info.f_type == TMPFS_MAGIC) GTEST_SKIP() << "test folder is on tmpfs";
  constexpr size_t kMiB = 1 << 20;
  auto chunk = RandomBytes(kMiB, 5);
  for (bool behind : {true, false}) {
    std::string path = dir_ / (behind ? "behind.raw" : "cached.raw");
    FileOptions o = options();
    o.write_behind = behind;
    auto sink = OpenFileSink(path, SinkMode::kCreateNew, o);
    ASSERT_TRUE(sink.ok()) << sink.error().ToString();
    for (size_t i = 0; i < 48; ++i) ASSERT_TRUE((*sink)->WriteAt(i * kMiB, chunk).ok());
    ASSERT_TRUE((*sink)->Flush().ok());
    // The first 16 MiB lie well behind the last write: with write-behind
    // they were written out and dropped; without it they stay cached.
    size_t resident = ResidentPages(path, 16 * kMiB);
    const size_t pages = 16 * kMiB / static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    if (behind) {
      EXPECT_LT(resident, pages / 4) << "write-behind left " << resident << " of " << pages << " pages cached";
    } else {
      EXPECT_GT(resident, pages / 2) << "without write-behind only " << resident << " of " << pages << " cached";
    }
    sink->reset();
    EXPECT_EQ(ReadFile(path).size(), 48 * kMiB);
  }
}

TEST_P(FileBackendTest, ReadBeyondEndIsInvalidArgument) {
  std::string path = dir_ / "small.raw";
  WriteFile(path, RandomBytes(4096, 2));
  auto source = Source(path);
  std::vector<std::byte> out(2);
  Status s = source->ReadAt(4095, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(source->ReadAt(4096, std::span<std::byte>()).ok());
}

TEST_P(FileBackendTest, ConcurrentReadAt) {
  std::string path = dir_ / "disk.raw";
  auto data = RandomBytes(4 << 20, 3);
  WriteFile(path, data);
  auto source = Source(path);
  constexpr int kThreads = 8;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> buf(65536 + t);
      for (int i = 0; i < 64; ++i) {
        uint64_t offset = (static_cast<uint64_t>(t) * 131071 + i * 50021) % (data.size() - buf.size());
        if (!source->ReadAt(offset, buf).ok() ||
            !std::equal(buf.begin(), buf.end(), data.begin() + offset)) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST_P(FileBackendTest, ReadManyBatchLargerThanQueueDepth) {
  std::string path = dir_ / "disk.raw";
  auto data = RandomBytes(2 << 20, 4);
  WriteFile(path, data);
  auto source = Source(path);
  constexpr size_t kRequests = 200;  // several rounds of a 64-entry ring
  std::vector<std::vector<std::byte>> bufs(kRequests);
  std::vector<ReadRequest> reqs(kRequests);
  for (size_t i = 0; i < kRequests; ++i) {
    bufs[i].resize(1000 + i * 37);
    reqs[i].offset = (i * 9973) % (data.size() - bufs[i].size());
    reqs[i].buffer = bufs[i];
  }
  ASSERT_TRUE(source->ReadMany(reqs).ok());
  for (size_t i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(reqs[i].status.ok());
    EXPECT_TRUE(std::equal(bufs[i].begin(), bufs[i].end(), data.begin() + reqs[i].offset)) << i;
  }
}

TEST_P(FileBackendTest, ReadManyReportsTheBadRequestOnly) {
  std::string path = dir_ / "disk.raw";
  auto data = RandomBytes(8192, 5);
  WriteFile(path, data);
  auto source = Source(path);
  std::vector<std::byte> a(100), b(100), c(100);
  std::vector<ReadRequest> reqs(3);
  reqs[0] = {0, a, {}};
  reqs[1] = {8150, b, {}};  // crosses the end
  reqs[2] = {8000, c, {}};
  Status s = source->ReadMany(reqs);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(reqs[0].status.ok());
  EXPECT_FALSE(reqs[1].status.ok());
  EXPECT_TRUE(reqs[2].status.ok());
  EXPECT_TRUE(std::equal(c.begin(), c.end(), data.begin() + 8000));
}

TEST_P(FileBackendTest, ExtentsOfSparseFile) {
  std::string path = dir_ / "sparse.raw";
  constexpr uint64_t kSize = 16 << 20;
  {
    auto sink = Sink(path, SinkMode::kCreateNew);
    ASSERT_TRUE(sink->Truncate(kSize).ok());
    ASSERT_TRUE(sink->WriteAt(1 << 20, RandomBytes(64 << 10, 6)).ok());
    ASSERT_TRUE(sink->WriteAt(8 << 20, RandomBytes(128 << 10, 7)).ok());
    ASSERT_TRUE(sink->Flush().ok());
  }
  auto source = Source(path);
  ASSERT_TRUE(source->capabilities().has_extents);
  auto extents = source->Extents(0, kSize);
  ASSERT_TRUE(extents.ok()) << extents.error().ToString();
  ExtentList expected = {
      {0, 1 << 20, ExtentKind::kHole},
      {1 << 20, 64 << 10, ExtentKind::kData},
      {(1 << 20) + (64 << 10), (7 << 20) - (64 << 10), ExtentKind::kHole},
      {8 << 20, 128 << 10, ExtentKind::kData},
      {(8 << 20) + (128 << 10), (8 << 20) - (128 << 10), ExtentKind::kHole},
  };
  EXPECT_EQ(*extents, expected);
  // A sub-range is clipped to exactly what was asked.
  auto sub = source->Extents((1 << 20) + 100, 1000);
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(*sub, (ExtentList{{(1 << 20) + 100, 1000, ExtentKind::kData}}));
}

TEST_P(FileBackendTest, WriteZeroesPunchesHoles) {
  std::string path = dir_ / "disk.raw";
  auto data = RandomBytes(4 << 20, 8);
  {
    auto sink = Sink(path, SinkMode::kCreateNew);
    ASSERT_TRUE(sink->WriteAt(0, data).ok());
    ASSERT_TRUE(sink->WriteZeroes(1 << 20, 1 << 20).ok());
    // Zeroing past the end grows the file and keeps the tail a hole.
    ASSERT_TRUE(sink->WriteZeroes(4 << 20, 1 << 20).ok());
    EXPECT_EQ(sink->size_bytes(), 5u << 20);
    ASSERT_TRUE(sink->Flush().ok());
  }
  std::fill(data.begin() + (1 << 20), data.begin() + (2 << 20), std::byte{0});
  data.resize(5 << 20);
  EXPECT_EQ(ReadFile(path), data);
  auto source = Source(path);
  auto extents = source->Extents(0, 5 << 20);
  ASSERT_TRUE(extents.ok());
  ExtentList expected = {
      {0, 1 << 20, ExtentKind::kData},
      {1 << 20, 1 << 20, ExtentKind::kHole},
      {2 << 20, 2 << 20, ExtentKind::kData},
      {4 << 20, 1 << 20, ExtentKind::kHole},
  };
  EXPECT_EQ(*extents, expected);
}

TEST_P(FileBackendTest, CreateNewRefusesExistingFile) {
  std::string path = dir_ / "exists.raw";
  WriteFile(path, RandomBytes(10, 9));
  auto sink = OpenFileSink(path, SinkMode::kCreateNew, options());
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.error().errno_value(), EEXIST);
  EXPECT_EQ(sink.error().path(), path);
}

TEST_P(FileBackendTest, MissingFileIsNotFound) {
  auto source = OpenFileSource(dir_ / "missing.raw", options());
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.error().code(), ErrorCode::kNotFound);
}

TEST_P(FileBackendTest, TruncateModeEmptiesAndIsZeroInitialized) {
  std::string path = dir_ / "disk.raw";
  WriteFile(path, RandomBytes(4096, 10));
  auto sink = Sink(path, SinkMode::kTruncate);
  EXPECT_EQ(sink->size_bytes(), 0u);
  EXPECT_TRUE(sink->capabilities().zero_initialized);
  auto existing = Sink(path, SinkMode::kExisting);
  EXPECT_FALSE(existing->capabilities().zero_initialized);
}

// A full file system must surface as kNoSpace with the errno and range. Uses
// a 1 MiB tmpfs; skipped where mounting is not allowed.
TEST_P(FileBackendTest, FullFileSystemIsNoSpace) {
  std::string mnt = dir_ / "tmpfs";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount tmpfs here";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  auto sink = Sink(mnt + "/disk.raw", SinkMode::kCreateNew);
  auto data = RandomBytes(4 << 20, 11);
  Status s = sink->WriteAt(0, data);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNoSpace) << s.error().ToString();
  EXPECT_EQ(s.error().errno_value(), ENOSPC);
  EXPECT_TRUE(s.error().offset().has_value());
}

INSTANTIATE_TEST_SUITE_P(Paths, FileBackendTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Uring" : "Sync"; });

TEST(FileBackendEnvTest, UringNotAllowedForcesFallback) {
  TempDir dir;
  std::string path = dir / "disk.raw";
  WriteFile(path, RandomBytes(4096, 12));
  SetUringAllowed(false);
  auto source = OpenFileSource(path);
  auto sink = OpenFileSink(path, SinkMode::kExisting);
  SetUringAllowed(true);
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE(sink.ok());
  EXPECT_FALSE(internal::IsUringBacked(**source));
  auto again = OpenFileSource(path);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(internal::IsUringBacked(**again));
}

}  // namespace
}  // namespace barge
