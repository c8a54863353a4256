// The disk element instant-restore defines the domain with.
#include "orchestrate/vm/instant_restore.h"

#include <gtest/gtest.h>

#include "orchestrate/libvirt/libvirt_conn.h"

namespace barge::orchestrate {
namespace {

TEST(InstantOverlayDiskXml, BlockDeviceWithBackingBecomesOverlayOverExport) {
  const std::string element =
      "<disk type='block' device='disk'>\n"
      "  <driver name='qemu' type='raw' cache='none' io='native'/>\n"
      "  <source dev='/dev/vg/vm1'>\n    <seclabel model='dac' relabel='no'/>\n  </source>\n"
      "  <backingStore type='file'><format type='qcow2'/><source file='/b.qcow2'/><backingStore/></backingStore>\n"
      "  <target dev='vdb' bus='virtio'/>\n"
      "  <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>\n"
      "</disk>";
  const std::string x = InstantOverlayDiskXml(element, "/s/o&v.qcow2", "/s/nbd.sock");
  std::vector<DomainDisk> disks = ParseDomainDisks(x);
  ASSERT_EQ(disks.size(), 1u) << x;
  EXPECT_EQ(disks[0].source_type, "file") << x;
  EXPECT_EQ(disks[0].source, "/s/o&amp;v.qcow2") << x;
  EXPECT_EQ(disks[0].format, "qcow2") << x;
  EXPECT_EQ(disks[0].target, "vdb") << x;
  EXPECT_NE(x.find("cache='none'"), std::string::npos) << x;
  EXPECT_NE(x.find("slot='0x05'"), std::string::npos) << x;
  EXPECT_NE(x.find("<source protocol='nbd'><host transport='unix' socket='/s/nbd.sock'/></source>"),
            std::string::npos)
      << x;
  EXPECT_EQ(x.find("/dev/vg/vm1"), std::string::npos) << x;
  EXPECT_EQ(x.find("/b.qcow2"), std::string::npos) << x;
  EXPECT_EQ(x.find("type='raw' cache"), std::string::npos) << x;
  // One driver type only, and the new backing chain is the only one.
  EXPECT_EQ(x.find("type='qcow2'"), x.rfind("type='qcow2'")) << x;
}

TEST(InstantOverlayDiskXml, RemoteBackingIsNbdOverTls) {
  const std::string element =
      "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/old.qcow2'/>"
      "<target dev='vda' bus='virtio'/></disk>";
  const std::string x = InstantOverlayDiskXmlTcp(element, "/h/.barge-instant-d.raw.qcow2", "10.0.0.1", 10810);
  std::vector<DomainDisk> disks = ParseDomainDisks(x);
  ASSERT_EQ(disks.size(), 1u) << x;
  EXPECT_EQ(disks[0].source, "/h/.barge-instant-d.raw.qcow2") << x;
  EXPECT_EQ(disks[0].target, "vda") << x;
  EXPECT_NE(x.find("<source protocol='nbd' tls='yes'><host name='10.0.0.1' port='10810'/></source>"),
            std::string::npos)
      << x;
  EXPECT_EQ(x.find("/old.qcow2"), std::string::npos) << x;
  EXPECT_EQ(x.find("unix"), std::string::npos) << x;
}

}  // namespace
}  // namespace barge::orchestrate
