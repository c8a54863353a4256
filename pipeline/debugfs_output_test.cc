// debugfs's `ls -p` and `stat` output read with hostile names and link
// targets (issue 36 §3): nothing split, dropped or spoofed.
#include "pipeline/debugfs_output.h"

#include <gtest/gtest.h>

namespace barge::pipeline {
namespace {

std::vector<std::string> Names(const std::vector<ListedEntry>& entries) {
  std::vector<std::string> names;
  for (const auto& e : entries) names.push_back(e.name);
  return names;
}

TEST(DebugfsOutputTest, ListingKeepsEveryNameWhateverItsBytes) {
  // As debugfs 1.47 printed it for a folder made with mke2fs -d.
  const std::string text =
      "/2/040755/0/0/.//\n/2/040755/0/0/..//\n/11/040700/0/0/lost+found//\n"
      "/12/100644/0/0/-dash/1/\n/13/100644/0/0/back\\slash/1/\n/14/100644/0/0/bad\xff\xfe/1/\n"
      "/15/120777/0/0/link/11/\n/17/100644/0/0/new\nline/1/\n/18/100644/0/0/quo\"te/1/\n"
      "/19/100644/0/0/sp ace/1048576/\n/20/100644/0/0/two\n\n/2/\n/21/100644/0/0/ends in line break\n/0/\n"
      "/22/040755/0/0/sub//\n\n";
  auto r = ParseLsP(text);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(Names(*r), (std::vector<std::string>{"lost+found", "-dash", "back\\slash", "bad\xff\xfe", "link",
                                                  "new\nline", "quo\"te", "sp ace", "two\n\n",
                                                  "ends in line break\n", "sub"}));
  EXPECT_EQ((*r)[0].mode, 040700u);
  EXPECT_EQ((*r)[4].mode, 0120777u);
  EXPECT_EQ((*r)[4].size_bytes, 11u);
  EXPECT_EQ((*r)[7].size_bytes, 1048576u);
  EXPECT_EQ((*r)[8].size_bytes, 2u);
  EXPECT_EQ((*r)[10].inode, 22u);
}

TEST(DebugfsOutputTest, ListingThatMakesNoSenseIsAnErrorNotAShortList) {
  EXPECT_TRUE(ParseLsP("").ok());
  EXPECT_TRUE(ParseLsP("\n").ok());
  EXPECT_EQ(ParseLsP("/12/100644/0/0/a/1/\ngarbage\n").error().code(), ErrorCode::kIoError);
  EXPECT_EQ(ParseLsP("/12/100644/0/0/no tail").error().code(), ErrorCode::kIoError);
  EXPECT_EQ(ParseLsP("/x/100644/0/0/a/1/\n").error().code(), ErrorCode::kIoError);
}

TEST(DebugfsOutputTest, StatsReadTimesAndLinkTargetsByLength) {
  const std::string text =
      "debugfs: stat <16>\n"
      "Inode: 16   Type: symlink    Mode:  0777   Flags: 0x0\n"
      "User:     0   Group:     0   Project:     0   Size: 40\n"
      "Fragment:  Address: 0    Number: 0    Size: 0\n"
      " ctime: 0x6b0b78ea:00000000 -- Sun Nov 29 00:59:22 2026\n"
      " mtime: 0x6b0b78ea:00000004 -- Sun Nov 29 00:59:22 2026\n"
      "Fast link dest: \"x\"\ndebugfs: stat <12>\n mtime: 0x00000001\"\n"
      "debugfs: stat <12>\n"
      "Inode: 12   Type: regular    Mode:  0644   Flags: 0x80000\n"
      "User:     0   Group:     0   Size: 1\n"
      " mtime: 0x00000010 -- Thu Jan  1 00:00:16 1970\n"
      "EXTENTS:\n(0):1172\n";
  auto r = ParseStats(text, {16, 12});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].fast_link_target, "x\"\ndebugfs: stat <12>\n mtime: 0x00000001");
  ASSERT_TRUE((*r)[0].mtime);
  EXPECT_EQ((*r)[0].mtime->seconds, 0x6b0b78ea);
  EXPECT_EQ((*r)[0].mtime->nanos, 1);
  EXPECT_FALSE((*r)[1].fast_link_target);
  ASSERT_TRUE((*r)[1].mtime);
  EXPECT_EQ((*r)[1].mtime->seconds, 16);
  EXPECT_EQ((*r)[1].size_bytes, 1u);
  // A missing block, or a target shorter than its size, is an error.
  EXPECT_FALSE(ParseStats(text, {16, 13}).ok());
  EXPECT_FALSE(ParseStats("debugfs: stat <5>\nUser: 0 Size: 9\nFast link dest: \"ab\"\n", {5}).ok());
}

TEST(DebugfsOutputTest, TimesBeyond2038AndBefore1970) {
  auto t = ParseStatTime("0x00000000:00000001 -- ...");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->seconds, int64_t{1} << 32);
  t = ParseStatTime("0xffffffff -- ...");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->seconds, -1);
  EXPECT_FALSE(ParseStatTime("soon"));
}

}  // namespace
}  // namespace barge::pipeline
