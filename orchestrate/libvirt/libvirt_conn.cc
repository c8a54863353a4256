// libvirt C API helpers.
#include "orchestrate/libvirt/libvirt_conn.h"

#include "orchestrate/libvirt/libvirt_uri.h"

#include <libvirt/virterror.h>

#include <cstdlib>
#include <mutex>

namespace barge::orchestrate {
namespace {

void SilentErrorHandler(void*, virErrorPtr) {}

}  // namespace

std::string ResolveLibvirtUri(const std::string& uri) {
  if (!uri.empty()) return uri;
  if (const char* env = std::getenv("BARGE_LIBVIRT_URI"); env && *env) return env;
  return "qemu:///system";
}

int LastVirErrorCode() {
  virErrorPtr e = virGetLastError();
  return e ? e->code : 0;
}

Error LastVirError(std::string_view what) {
  virErrorPtr e = virGetLastError();
  std::string msg = std::string(what) + ": " + (e && e->message ? e->message : "unknown libvirt error");
  ErrorCode code = ErrorCode::kIoError;
  if (e) {
    switch (e->code) {
      case VIR_ERR_NO_DOMAIN:
      case VIR_ERR_NO_DOMAIN_CHECKPOINT:
        code = ErrorCode::kNotFound;
        break;
      case VIR_ERR_AGENT_UNRESPONSIVE:
      case VIR_ERR_AGENT_UNSYNCED:
      case VIR_ERR_NO_SUPPORT:
      case VIR_ERR_OPERATION_UNSUPPORTED:
        code = ErrorCode::kNotSupported;
        break;
      case VIR_ERR_INVALID_ARG:
      case VIR_ERR_XML_ERROR:
        code = ErrorCode::kInvalidArgument;
        break;
      default:
        break;
    }
  }
  return Error(code, std::move(msg));
}

Result<VirConnection> ConnectLibvirt(const std::string& uri) {
  static std::once_flag once;
  std::call_once(once, [] { virSetErrorFunc(nullptr, SilentErrorHandler); });
  std::string u = ResolveLibvirtUri(uri);
  virConnectPtr c = virConnectOpen(u.c_str());
  if (!c) return LastVirError("connect to " + RedactLibvirtUri(u));
  return VirConnection(c);
}

Result<VirDomain> LookupDomain(virConnectPtr conn, const std::string& name) {
  virDomainPtr d = virDomainLookupByName(conn, name.c_str());
  if (!d) {
    if (LastVirErrorCode() == VIR_ERR_NO_DOMAIN) {
      std::string where;
      if (char* uri = virConnectGetURI(conn)) {
        where = " in " + RedactLibvirtUri(uri);
        std::free(uri);
      }
      return Error::NotFound("domain '" + name + "' does not exist" + where);
    }
    return LastVirError("domain '" + name + "'");
  }
  return VirDomain(d);
}

std::string ConnectionUri(virDomainPtr dom) {
  virConnectPtr conn = virDomainGetConnect(dom);
  if (conn == nullptr) return "";
  char* uri = virConnectGetURI(conn);
  if (uri == nullptr) return "";
  std::string s(uri);
  std::free(uri);
  return s;
}

bool DomainIsActive(virDomainPtr dom) { return virDomainIsActive(dom) == 1; }

std::string DomainStateName(int state) {
  switch (state) {
    case VIR_DOMAIN_RUNNING: return "running";
    case VIR_DOMAIN_BLOCKED: return "blocked";
    case VIR_DOMAIN_PAUSED: return "paused";
    case VIR_DOMAIN_SHUTDOWN: return "shutting down";
    case VIR_DOMAIN_SHUTOFF: return "shut off";
    case VIR_DOMAIN_CRASHED: return "crashed";
    case VIR_DOMAIN_PMSUSPENDED: return "suspended";
    default: return "unknown";
  }
}

Result<std::vector<VirDomain>> ListDomains(virConnectPtr conn, unsigned int flags) {
  virDomainPtr* list = nullptr;
  const int n = virConnectListAllDomains(conn, &list, flags);
  if (n < 0) return LastVirError("list domains");
  std::vector<VirDomain> doms;
  doms.reserve(n);
  for (int i = 0; i < n; ++i) doms.emplace_back(list[i]);
  std::free(list);
  return doms;
}

std::string XmlAttr(std::string_view xml, std::string_view tag, std::string_view name) {
  std::string open = "<" + std::string(tag);
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    char next = pos + open.size() < xml.size() ? xml[pos + open.size()] : '>';
    if (next == ' ' || next == '>' || next == '/' || next == '\n' || next == '\t') break;
    pos += open.size();
  }
  if (pos == std::string_view::npos) return "";
  size_t end = xml.find('>', pos);
  std::string_view t = xml.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
  for (char q : {'\'', '"'}) {
    std::string key = " " + std::string(name) + "=" + q;
    size_t a = t.find(key);
    if (a == std::string_view::npos) continue;
    a += key.size();
    size_t b = t.find(q, a);
    if (b == std::string_view::npos) return "";
    return std::string(t.substr(a, b - a));
  }
  return "";
}

std::string XmlText(std::string_view xml, std::string_view tag) {
  std::string open = "<" + std::string(tag) + ">";
  std::string close = "</" + std::string(tag) + ">";
  size_t a = xml.find(open);
  if (a == std::string_view::npos) return "";
  a += open.size();
  size_t b = xml.find(close, a);
  if (b == std::string_view::npos) return "";
  return std::string(xml.substr(a, b - a));
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&apos;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// The first position at or after `from` where `needle` (a folder's name)
// stands as a whole path value or its leading folder; npos if none.
size_t FindPathAt(std::string_view text, std::string_view needle, size_t from) {
  if (needle.empty()) return std::string_view::npos;
  for (size_t at = text.find(needle, from); at != std::string_view::npos; at = text.find(needle, at + 1)) {
    const char before = at == 0 ? ' ' : text[at - 1];
    const size_t end = at + needle.size();
    const char after = end < text.size() ? text[end] : ' ';
    if ((before == '\'' || before == '"' || before == '>') &&
        (after == '\'' || after == '"' || after == '<' || after == '/')) {
      return at;
    }
  }
  return std::string_view::npos;
}

}  // namespace

bool NamesPathInside(std::string_view text, const std::string& dir, bool xml) {
  return FindPathAt(text, xml ? XmlEscape(dir) : dir, 0) != std::string_view::npos;
}

std::string ReplacePathPrefix(std::string_view text, const std::string& old_dir, const std::string& new_dir,
                              bool xml) {
  const std::string needle = xml ? XmlEscape(old_dir) : old_dir;
  const std::string with = xml ? XmlEscape(new_dir) : new_dir;
  std::string out;
  size_t copied = 0;
  for (size_t at = FindPathAt(text, needle, 0); at != std::string_view::npos;
       at = FindPathAt(text, needle, copied)) {
    out.append(text.substr(copied, at - copied));
    out += with;
    copied = at + needle.size();
  }
  out.append(text.substr(copied));
  return out;
}

std::string MovePath(const std::string& path, const std::string& old_dir, const std::string& new_dir) {
  if (path == old_dir) return new_dir;
  if (path.size() > old_dir.size() && path.compare(0, old_dir.size(), old_dir) == 0 && path[old_dir.size()] == '/') {
    return new_dir + path.substr(old_dir.size());
  }
  return path;
}

std::vector<DomainDisk> ParseDomainDisks(std::string_view xml) {
  std::vector<DomainDisk> out;
  size_t pos = 0;
  while ((pos = xml.find("<disk ", pos)) != std::string_view::npos) {
    size_t end = xml.find("</disk>", pos);
    if (end == std::string_view::npos) break;
    std::string_view el = xml.substr(pos, end + 7 - pos);
    pos = end + 7;
    std::string device = XmlAttr(el, "disk", "device");
    if (!device.empty() && device != "disk") continue;
    DomainDisk d;
    d.element = std::string(el);
    d.target = XmlAttr(el, "target", "dev");
    d.source_type = XmlAttr(el, "disk", "type");
    d.source = XmlAttr(el, "source", d.source_type == "block" ? "dev" : "file");
    d.format = XmlAttr(el, "driver", "type");
    if (!d.target.empty()) out.push_back(std::move(d));
  }
  return out;
}

Result<std::string> DomainXml(virDomainPtr dom, unsigned int flags) {
  char* x = virDomainGetXMLDesc(dom, flags);
  if (!x) return LastVirError("domain XML");
  std::string s(x);
  free(x);
  return s;
}

Result<std::vector<DomainDisk>> DomainDisks(virDomainPtr dom) {
  BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom));
  return ParseDomainDisks(xml);
}

Result<uint64_t> DiskCapacity(virDomainPtr dom, const std::string& target) {
  virDomainBlockInfo info{};
  if (virDomainGetBlockInfo(dom, target.c_str(), &info, 0) != 0) {
    return LastVirError("block info of " + target);
  }
  return static_cast<uint64_t>(info.capacity);
}

Result<uint64_t> DiskAllocation(virDomainPtr dom, const std::string& target) {
  virDomainBlockInfo info{};
  if (virDomainGetBlockInfo(dom, target.c_str(), &info, 0) != 0) {
    return LastVirError("block info of " + target);
  }
  return static_cast<uint64_t>(info.physical ? info.physical : info.allocation);
}

Result<VirCheckpoint> LookupCheckpoint(virDomainPtr dom, const std::string& name) {
  virDomainCheckpointPtr cp = virDomainCheckpointLookupByName(dom, name.c_str(), 0);
  if (!cp) return LastVirError("checkpoint '" + name + "'");
  return VirCheckpoint(cp);
}

Result<std::string> CheckpointXml(virDomainCheckpointPtr cp, unsigned int flags) {
  char* x = virDomainCheckpointGetXMLDesc(cp, flags);
  if (!x) return LastVirError("checkpoint XML");
  std::string s(x);
  free(x);
  return s;
}

Result<std::vector<std::string>> ListCheckpointNames(virDomainPtr dom) {
  virDomainCheckpointPtr* cps = nullptr;
  int n = virDomainListAllCheckpoints(dom, &cps, 0);
  if (n < 0) return LastVirError("list checkpoints");
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    out.emplace_back(virDomainCheckpointGetName(cps[i]));
    virDomainCheckpointFree(cps[i]);
  }
  free(cps);
  return out;
}

Status DeleteCheckpoint(virDomainPtr dom, const std::string& name, bool metadata_only) {
  BARGE_ASSIGN_OR_RETURN(auto cp, LookupCheckpoint(dom, name));
  unsigned int flags = metadata_only ? VIR_DOMAIN_CHECKPOINT_DELETE_METADATA_ONLY : 0;
  if (virDomainCheckpointDelete(cp.get(), flags) != 0) {
    return LastVirError("delete checkpoint '" + name + "'");
  }
  return OkStatus();
}

}  // namespace barge::orchestrate
