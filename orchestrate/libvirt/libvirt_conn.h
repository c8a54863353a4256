// RAII owners for libvirt connections, domains and checkpoints, libvirt
// errors as barge Errors, and the few domain-XML facts orchestration needs.
// The libvirt C API only; never virsh.
#pragma once

#include <libvirt/libvirt.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"

namespace barge::orchestrate {

struct VirConnectDeleter { void operator()(virConnectPtr p) const { virConnectClose(p); } };
struct VirDomainDeleter { void operator()(virDomainPtr p) const { virDomainFree(p); } };
struct VirCheckpointDeleter {
  void operator()(virDomainCheckpointPtr p) const { virDomainCheckpointFree(p); }
};
using VirConnection = std::unique_ptr<virConnect, VirConnectDeleter>;
using VirDomain = std::unique_ptr<virDomain, VirDomainDeleter>;
using VirCheckpoint = std::unique_ptr<virDomainCheckpoint, VirCheckpointDeleter>;

// The URI: `uri`, else $BARGE_LIBVIRT_URI, else qemu:///system.
std::string ResolveLibvirtUri(const std::string& uri);

// Opens a connection (libvirt's own error printing is silenced once). An
// error names the URI without its password (RedactLibvirtUri).
Result<VirConnection> ConnectLibvirt(const std::string& uri = "");
Result<VirDomain> LookupDomain(virConnectPtr conn, const std::string& name);  // kNotFound
// The URI of the connection `dom` came from, as libvirt gives it (may hold a
// password: RedactLibvirtUri before printing it); "" if libvirt cannot say.
std::string ConnectionUri(virDomainPtr dom);

// The last libvirt error of this thread as an Error: "what: <libvirt message>";
// missing domain/checkpoint -> kNotFound, guest agent problems -> kNotSupported.
Error LastVirError(std::string_view what);
// The libvirt error code (virErrorNumber) of the last error, 0 if none.
int LastVirErrorCode();

bool DomainIsActive(virDomainPtr dom);
// "running", "paused", "shut off", ... for a virDomainState.
std::string DomainStateName(int state);

// Every domain of the connection (virConnectListAllDomains `flags`:
// 0 = all, VIR_CONNECT_LIST_DOMAINS_PERSISTENT, ...).
Result<std::vector<VirDomain>> ListDomains(virConnectPtr conn, unsigned int flags = 0);

// A disk of a domain as its XML says (device='disk' only).
struct DomainDisk {
  std::string target;       // "vda"
  std::string source_type;  // "file", "block", ...
  std::string source;       // the file or device path
  std::string format;       // driver type: "qcow2", "raw"
  std::string element;      // the whole <disk>...</disk> text
};

// Parses the <disk device='disk'> elements of a domain XML.
std::vector<DomainDisk> ParseDomainDisks(std::string_view domain_xml);
Result<std::string> DomainXml(virDomainPtr dom, unsigned int flags = 0);
Result<std::vector<DomainDisk>> DomainDisks(virDomainPtr dom);
// Virtual size of a disk (virDomainGetBlockInfo capacity).
Result<uint64_t> DiskCapacity(virDomainPtr dom, const std::string& target);
Result<uint64_t> DiskAllocation(virDomainPtr dom, const std::string& target);

// Checkpoints.
Result<VirCheckpoint> LookupCheckpoint(virDomainPtr dom, const std::string& name);  // kNotFound
Result<std::string> CheckpointXml(virDomainCheckpointPtr cp, unsigned int flags = 0);
Result<std::vector<std::string>> ListCheckpointNames(virDomainPtr dom);
// Deletes a checkpoint (bitmaps too, unless metadata_only).
Status DeleteCheckpoint(virDomainPtr dom, const std::string& name, bool metadata_only = false);

// Value of attribute `name` in the first tag `<tag ...>` of `xml`, "" if absent.
std::string XmlAttr(std::string_view xml, std::string_view tag, std::string_view name);
// Text of the first <tag>text</tag>, "" if absent.
std::string XmlText(std::string_view xml, std::string_view tag);
// Escapes &, <, >, ', " for XML attribute and text content.
std::string XmlEscape(std::string_view s);

// Paths named in domain XML, checkpoint XML or a JSON text, for moving a
// folder (barge state migrate). A path counts only as a whole value: it
// starts after a quote or '>' and the folder's name ends at a quote, '<'
// or '/' (so "/s/vm" matches "/s/vm" and "/s/vm/x", never "/s/vm2"). `dir`
// is absolute; with `xml` it is matched XML-escaped.
// Whether `text` names `dir` or a path inside it.
bool NamesPathInside(std::string_view text, const std::string& dir, bool xml);
// `text` with every such path made to name `new_dir` instead of `old_dir`.
std::string ReplacePathPrefix(std::string_view text, const std::string& old_dir, const std::string& new_dir,
                              bool xml);
// A bare path value (no quotes around it): moved below `new_dir` when it is
// `old_dir` or inside it, else unchanged.
std::string MovePath(const std::string& path, const std::string& old_dir, const std::string& new_dir);

}  // namespace barge::orchestrate
