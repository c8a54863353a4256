// ProbeFormatName: what a file's first bytes say it is (issue 12's mix-ups:
// a qcow2 or other image given as a raw data file, a ".qcow2" that is raw).
#include <gtest/gtest.h>

#include <cstring>

#include "blockio/memory.h"
#include "formats/image.h"

namespace barge::formats {
namespace {

std::string Probe(const std::string& head, size_t at = 0, size_t size = 4096) {
  std::vector<std::byte> bytes(size);
  std::memcpy(bytes.data() + at, head.data(), head.size());
  MemorySource src(std::move(bytes));
  auto r = ProbeFormatName(src);
  return r.ok() ? *r : "error: " + r.error().ToString();
}

TEST(ProbeFormatNameTest, KnownMagicsAndRaw) {
  EXPECT_EQ(Probe(std::string("QFI\xfb\0\0\0\3", 8)), "qcow2");
  EXPECT_EQ(Probe(std::string("QED\0", 4)), "qed");
  EXPECT_EQ(Probe("KDMV"), "vmdk");
  EXPECT_EQ(Probe("# Disk DescriptorFile\nversion=1"), "vmdk");
  EXPECT_EQ(Probe("vhdxfile"), "vhdx");
  EXPECT_EQ(Probe("conectix"), "vpc");
  EXPECT_EQ(Probe(std::string("\x7f\x10\xda\xbe", 4), 64), "vdi");
  EXPECT_EQ(Probe(std::string("LUKS\xba\xbe", 6)), "luks");
  EXPECT_EQ(Probe("hello, world"), "raw");
  EXPECT_EQ(Probe("", 0, 0), "raw");   // empty
  EXPECT_EQ(Probe("QF", 0, 2), "raw");  // shorter than any magic
}

}  // namespace
}  // namespace barge::formats
