// `info`, `map` and `check` as a person reads them, and what check refuses
// before it looks: an NBD export, a file that is not qcow2.
#include "pipeline/image_report.h"

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(ImageReportTest, CheckRefusesWhatIsNotAQcow2File) {
  auto nbd = CheckQcow2File(Env::Default(), "nbd://127.0.0.1:1/x");
  ASSERT_FALSE(nbd.ok());
  EXPECT_EQ(nbd.error().code(), ErrorCode::kNotSupported);

  barge::testing::TempDir dir;
  const std::string raw = dir / "disk.raw";
  barge::testing::WriteFile(raw, std::vector<std::byte>(4096, std::byte{0}));
  auto r = CheckQcow2File(Env::Default(), raw);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Has(r.error().message(), "hold no image header: raw")) << r.error().message();
  EXPECT_TRUE(Has(r.error().ToString(), raw)) << r.error().ToString();

  EXPECT_FALSE(CheckQcow2File(Env::Default(), dir / "missing.qcow2").ok());
}

TEST(ImageReportTest, CheckTextAsQemuImg) {
  formats::qcow2::CheckReport r;
  r.total_clusters = 4;
  r.allocated_clusters = 2;
  r.compressed_clusters = 1;
  r.fragmented_clusters = 1;
  r.image_end_offset = 262144;
  EXPECT_EQ(CheckReportText(r), "No errors were found on the image.\n"
                                "2/4 = 50.00% allocated, 50.00% fragmented, 50.00% compressed clusters\n"
                                "Image end offset: 262144\n");
  formats::qcow2::CheckReport bad;
  bad.corruptions = 1;
  bad.leaks = 2;
  bad.messages = {"ERROR cluster 5 refcount=0 reference=1"};
  EXPECT_EQ(CheckReportText(bad), "ERROR cluster 5 refcount=0 reference=1\n"
                                  "1 errors were found on the image.\n"
                                  "2 leaked clusters were found on the image.\n");
}

TEST(ImageReportTest, MapNamesTheLayerThatAnswers) {
  MapEntry data, hole;
  data.length = hole.start = hole.length = 65536;
  data.depth = 1;
  data.present = data.data = true;
  const std::string text = MapText({data, hole}, {"/top.qcow2", "/base.qcow2"});
  EXPECT_EQ(text.rfind("Offset              Length              Kind    Depth File\n", 0), 0u) << text;
  EXPECT_TRUE(Has(text, "0x0                 0x10000             data    1     /base.qcow2\n")) << text;
  EXPECT_TRUE(Has(text, "0x10000             0x10000             hole    0     -\n")) << text;
  EXPECT_TRUE(Has(text, "hole = allocated in no layer")) << text;
}

TEST(ImageReportTest, InfoOfARawLayerAndTheMissingBackingFormat) {
  formats::ImageInfo info;
  info.path = "/d.raw";
  info.format = formats::ImageFormat::kRaw;
  info.virtual_size = 1024;
  info.file_size = 1024;
  const std::string raw = ImageInfoText(info, std::nullopt);
  EXPECT_EQ(raw.rfind("image: /d.raw\nfile format: raw\n", 0), 0u) << raw;
  EXPECT_FALSE(Has(raw, "disk size:")) << raw;  // not learnt: not said
  EXPECT_FALSE(Has(raw, "cluster_size")) << raw;

  formats::ImageInfo q;
  q.path = "/top.qcow2";
  q.backing_file = "base.img";
  EXPECT_EQ(MissingBackingFormatFix(q),
            "backing file 'base.img' has no recorded format and barge never probes formats, so the image's data "
            "cannot be read; record it with `qemu-img rebase -u -F <raw|qcow2> -b 'base.img' /top.qcow2`");
  EXPECT_EQ(VmClockText(3723004000000ULL), "01:02:03.004");
}

}  // namespace
}  // namespace barge::pipeline
