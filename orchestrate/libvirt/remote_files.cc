// Files on a libvirt host through its storage driver (remote_files.h).
#include "orchestrate/libvirt/remote_files.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "orchestrate/libvirt/libvirt_conn.h"

namespace barge::orchestrate {
namespace {

struct VirStreamDeleter {
  void operator()(virStreamPtr s) const { virStreamFree(s); }
};
using VirStream = std::unique_ptr<virStream, VirStreamDeleter>;

constexpr size_t kStreamChunk = 256 << 10;

Result<VirVol> LookupFile(virStoragePoolPtr pool, const std::string& name) {
  VirVol v(virStorageVolLookupByName(pool, name.c_str()));
  if (v == nullptr) return LastVirError("find " + name + " on the host");
  return v;
}

Result<VirStream> NewStream(virStoragePoolPtr pool) {
  VirStream s(virStreamNew(virStoragePoolGetConnect(pool), 0));
  if (s == nullptr) return LastVirError("open a libvirt stream");
  return s;
}

}  // namespace

Result<VirPool> OpenRemoteFolder(virConnectPtr conn, const std::string& dir, const std::string& name,
                                 std::string* transient) {
  VirPool pool(virStoragePoolLookupByTargetPath(conn, dir.c_str()));
  if (pool == nullptr && !transient->empty()) pool.reset(virStoragePoolLookupByName(conn, transient->c_str()));
  if (pool == nullptr) {
    const std::string xml = "<pool type='dir'><name>" + XmlEscape(name) + "</name><target><path>" + XmlEscape(dir) +
                            "</path></target></pool>";
    pool.reset(virStoragePoolCreateXML(conn, xml.c_str(), 0));
    if (pool == nullptr) return LastVirError("open the folder " + dir + " on the host (a storage pool)");
    *transient = name;
  }
  if (virStoragePoolIsActive(pool.get()) != 1 && virStoragePoolCreate(pool.get(), 0) != 0) {
    return LastVirError("start the storage pool over " + dir);
  }
  if (virStoragePoolRefresh(pool.get(), 0) != 0) return LastVirError("list " + dir + " on the host");
  return pool;
}

Status CloseRemoteFolder(virStoragePoolPtr pool, const std::string& transient) {
  if (pool == nullptr || transient.empty()) return OkStatus();
  if (virStoragePoolIsActive(pool) == 1 && virStoragePoolDestroy(pool) != 0) {
    return LastVirError("stop the storage pool " + transient);
  }
  return OkStatus();
}

bool RemoteFileExists(virStoragePoolPtr pool, const std::string& name) {
  VirVol v(virStorageVolLookupByName(pool, name.c_str()));
  return v != nullptr;
}

Status CreateRemoteFolder(virStoragePoolPtr pool, const std::string& name, uint32_t mode, int64_t uid, int64_t gid) {
  char octal[16];
  std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
  std::string permissions = std::string("<permissions><mode>") + octal + "</mode>";
  if (uid >= 0) permissions += "<owner>" + std::to_string(uid) + "</owner>";
  if (gid >= 0) permissions += "<group>" + std::to_string(gid) + "</group>";
  // A 'dir' volume: libvirt's dir pool mkdirs it (without its pools'
  // "allow existing"), then chowns and chmods what it made.
  const std::string xml = "<volume type='dir'><name>" + XmlEscape(name) +
                          "</name><capacity unit='bytes'>0</capacity><target><format type='dir'/>" + permissions +
                          "</permissions></target></volume>";
  VirVol v(virStorageVolCreateXML(pool, xml.c_str(), 0));
  if (v == nullptr) return LastVirError("create the folder " + name + " on the host");
  return OkStatus();
}

Status DeleteRemoteFile(virStoragePoolPtr pool, const std::string& name) {
  VirVol v(virStorageVolLookupByName(pool, name.c_str()));
  if (v == nullptr) return OkStatus();
  if (virStorageVolDelete(v.get(), 0) != 0) return LastVirError("delete " + name + " on the host");
  return OkStatus();
}

Status CreateRemoteFile(virStoragePoolPtr pool, const std::string& name, const std::string& format, uint64_t size,
                        uint32_t mode) {
  BARGE_RETURN_IF_ERROR(DeleteRemoteFile(pool, name));
  std::string permissions;
  if (mode != 0) {
    char octal[16];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
    permissions = std::string("<permissions><mode>") + octal + "</mode></permissions>";
  }
  const std::string xml = "<volume><name>" + XmlEscape(name) + "</name><capacity unit='bytes'>" +
                          std::to_string(size) + "</capacity><allocation>0</allocation><target><format type='" +
                          format + "'/>" + permissions + "</target></volume>";
  VirVol v(virStorageVolCreateXML(pool, xml.c_str(), 0));
  if (v == nullptr) return LastVirError("create " + name + " (" + format + ") on the host");
  return OkStatus();
}

Result<RemoteFileInfo> StatRemoteFile(virStoragePoolPtr pool, const std::string& name) {
  BARGE_ASSIGN_OR_RETURN(VirVol v, LookupFile(pool, name));
  RemoteFileInfo info;
  if (char* path = virStorageVolGetPath(v.get())) {
    info.path = path;
    free(path);
  }
  virStorageVolInfo vi{};
  if (virStorageVolGetInfo(v.get(), &vi) != 0) return LastVirError("the size of " + name + " on the host");
  info.size = vi.capacity;
  char* xml = virStorageVolGetXMLDesc(v.get(), 0);
  if (xml == nullptr) return LastVirError("describe " + name + " on the host");
  const std::string desc(xml);
  free(xml);
  // Untrusted text: numbers only.
  const std::string mode = XmlText(desc, "mode"), owner = XmlText(desc, "owner"), group = XmlText(desc, "group");
  auto number = [](const std::string& s, int base, uint32_t* out) {
    if (s.empty()) return false;
    char* end = nullptr;
    const unsigned long n = std::strtoul(s.c_str(), &end, base);
    if (end == nullptr || *end != '\0' || n > 0xffffffffUL) return false;
    *out = static_cast<uint32_t>(n);
    return true;
  };
  info.has_owner = number(mode, 8, &info.mode) && number(owner, 10, &info.uid) && number(group, 10, &info.gid);
  return info;
}

Status UploadRemoteFile(virStoragePoolPtr pool, const std::string& name, uint64_t offset,
                        std::span<const std::byte> bytes) {
  BARGE_ASSIGN_OR_RETURN(VirVol v, LookupFile(pool, name));
  BARGE_ASSIGN_OR_RETURN(VirStream s, NewStream(pool));
  if (virStorageVolUpload(v.get(), s.get(), offset, bytes.size(), 0) != 0) {
    return LastVirError("write " + name + " on the host");
  }
  size_t sent = 0;
  while (sent < bytes.size()) {
    const size_t n = std::min(kStreamChunk, bytes.size() - sent);
    const int done = virStreamSend(s.get(), reinterpret_cast<const char*>(bytes.data() + sent), n);
    if (done <= 0) {
      Error e = LastVirError("write " + name + " on the host (at byte " + std::to_string(offset + sent) + ")");
      virStreamAbort(s.get());
      return e;
    }
    sent += static_cast<size_t>(done);
  }
  if (virStreamFinish(s.get()) != 0) return LastVirError("finish writing " + name + " on the host");
  return OkStatus();
}

Status CheckRemoteFile(virStoragePoolPtr pool, const std::string& name, uint64_t offset,
                       std::span<const std::byte> expected) {
  BARGE_ASSIGN_OR_RETURN(VirVol v, LookupFile(pool, name));
  BARGE_ASSIGN_OR_RETURN(VirStream s, NewStream(pool));
  if (virStorageVolDownload(v.get(), s.get(), offset, expected.size(), 0) != 0) {
    return LastVirError("read " + name + " back from the host");
  }
  std::vector<char> buf(kStreamChunk);
  size_t got = 0;
  for (;;) {
    const int n = virStreamRecv(s.get(), buf.data(), buf.size());
    if (n < 0) {
      Error e = LastVirError("read " + name + " back from the host (at byte " + std::to_string(offset + got) + ")");
      virStreamAbort(s.get());
      return e;
    }
    if (n == 0) break;
    const size_t len = static_cast<size_t>(n);
    if (got + len > expected.size() || std::memcmp(buf.data(), expected.data() + got, len) != 0) {
      virStreamAbort(s.get());
      return Error::IoError(name + " on the host does not hold what was written (bytes " +
                               std::to_string(offset + got) + " to " + std::to_string(offset + got + len) + ")");
    }
    got += len;
  }
  if (virStreamFinish(s.get()) != 0) return LastVirError("finish reading " + name + " back from the host");
  if (got != expected.size()) {
    return Error::IoError(name + " on the host is short: " + std::to_string(offset + got) + " bytes, " +
                             std::to_string(offset + expected.size()) + " written");
  }
  return OkStatus();
}

}  // namespace barge::orchestrate
