// StageStream: a stream read once into a private file that is gone before
// anyone reads it, under the stream's own name; a failed fill leaves
// nothing behind.
#include "blockio/staged_stream.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "tests/testing/testing.h"

namespace barge {
namespace {

using testing::TempDir;

TEST(StagedStreamTest, TheStreamIsReadFromAFileThatIsAlreadyGone) {
  TempDir dir;
  std::vector<std::byte> data(3 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 7);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  // A writer thread would do; the pipe's buffer is smaller than the data.
  std::thread writer([&] {
    size_t done = 0;
    while (done < data.size()) done += static_cast<size_t>(::write(pipe_fds[1], data.data() + done, data.size() - done));
    ::close(pipe_fds[1]);
  });
  uint64_t read = 0;
  auto source = StageStream(PosixEnv(), dir.path().string(), "standard input", [&](const StreamWriter& w) -> Status {
    BARGE_ASSIGN_OR_RETURN(read, ReadFdToEnd(pipe_fds[0], "standard input", w));
    return OkStatus();
  });
  writer.join();
  ::close(pipe_fds[0]);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_EQ(read, data.size());
  EXPECT_EQ((*source)->name(), "standard input");
  ASSERT_EQ((*source)->size_bytes(), data.size());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE((*source)->ReadAt(0, back).ok());
  EXPECT_EQ(back, data);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(StagedStreamTest, AFailedFillLeavesNothing) {
  TempDir dir;
  auto source = StageStream(PosixEnv(), dir.path().string(), "u", [](const StreamWriter& w) -> Status {
    const std::byte b[4] = {};
    BARGE_RETURN_IF_ERROR(w(0, b));
    return Error::IoError("cut");
  });
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.error().message(), "cut");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace barge
