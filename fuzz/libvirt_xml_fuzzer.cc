// Fuzzes barge's readers of libvirt XML replies: the domain XML's disks, the
// checkpoint XML's disks, attribute and element text lookups and the DAC
// label. They are string scans, not a full XML parser: any text must give
// some answer without reading out of bounds or throwing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "orchestrate/vm/cbt.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/vm/tracker.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge::orchestrate;
  const std::string xml(reinterpret_cast<const char*>(data), size);
  for (const DomainDisk& d : ParseDomainDisks(xml)) {
    if (d.target.empty() || xml.find(d.element) == std::string::npos) std::abort();
    (void)XmlEscape(d.source);
  }
  (void)CheckpointDisks(xml);
  (void)XmlAttr(xml, "disk", "name");
  (void)XmlAttr(xml, "source", "file");
  (void)XmlText(xml, "name");
  for (size_t from : {size_t{0}, size / 2, size}) {
    (void)ParseDacLabel(ElementText(xml, "label", from));
    (void)ElementText(xml, "baselabel", from);
  }
  (void)ParseDacLabel(xml);
  return 0;
}
