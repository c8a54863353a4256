// FileAccess: a folder's mode decides its files'; folders and files get the
// exact mode asked for whatever the umask; a planted link is never changed.
#include "pipeline/file_access.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

using testing::TempDir;

uint32_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Sets the umask for the scope.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t m) : old_(::umask(m)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

TEST(FileAccessTest, FilesTakeWhatTheirFolderLetsRead) {
  FileStat dir;
  dir.gid = 42;
  dir.mode = 0700;
  EXPECT_EQ(FileAccess::OfFolder(dir).file_mode, 0600u);
  EXPECT_FALSE(FileAccess::OfFolder(dir).gid);
  dir.mode = 02750;
  EXPECT_EQ(FileAccess::OfFolder(dir).file_mode, 0640u);
  EXPECT_EQ(FileAccess::OfFolder(dir).gid, 42u);
  dir.mode = 0750;  // not setgid: files keep their maker's group
  EXPECT_EQ(FileAccess::OfFolder(dir).file_mode, 0640u);
  EXPECT_FALSE(FileAccess::OfFolder(dir).gid);
  dir.mode = 0755;  // a chain made before: as it was
  EXPECT_EQ(FileAccess::OfFolder(dir).file_mode, 0644u);
}

TEST(FileAccessTest, ExactWhateverTheUmask) {
  TempDir tmp;
  Env& env = PosixEnv();
  const uint32_t gid = static_cast<uint32_t>(::getegid());
  ScopedUmask umask(077);
  auto made = CreateFolders(env, tmp / "a/b", FileAccess::Group(gid));
  ASSERT_TRUE(made.ok()) << made.error().ToString();
  EXPECT_EQ(made->size(), 2u);
  EXPECT_EQ(ModeOf(tmp / "a"), 02750u);
  EXPECT_EQ(ModeOf(tmp / "a/b"), 02750u);
  ASSERT_TRUE(WriteFileLikeFolder(env, tmp / "a/b/f", std::string_view("x")).ok());
  EXPECT_EQ(ModeOf(tmp / "a/b/f"), 0640u);
  {
    ScopedUmask open(0);
    ASSERT_TRUE(CreateFolders(env, tmp / "p", FileAccess::Private()).ok());
    EXPECT_EQ(ModeOf(tmp / "p"), 0700u);
    ASSERT_TRUE(WriteFileLikeFolder(env, tmp / "p/f", std::string_view("x")).ok());
    EXPECT_EQ(ModeOf(tmp / "p/f"), 0600u);
  }
  // Sharing a private folder later gives it and its files to the group; a
  // symbolic link in it is left alone (never followed).
  ASSERT_TRUE(env.WriteFileAtomic(tmp / "victim", std::string_view("v"), false, 0604).ok());
  ASSERT_EQ(::chmod((tmp / "victim").c_str(), 0604), 0);
  ASSERT_EQ(::symlink((tmp / "victim").c_str(), (tmp / "p/link").c_str()), 0);
  ASSERT_TRUE(ShareFolder(env, tmp / "p", FileAccess::Group(gid)).ok());
  EXPECT_EQ(ModeOf(tmp / "p"), 02750u);
  EXPECT_EQ(ModeOf(tmp / "p/f"), 0640u);
  EXPECT_EQ(ModeOf(tmp / "victim"), 0604u);
  EXPECT_EQ(LookupGroup("no-such-group-35").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(*LookupGroup("7"), 7u);
}

}  // namespace
}  // namespace barge::pipeline
