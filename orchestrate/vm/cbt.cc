// CBT enable/disable/status over libvirt domain definitions.
#include "orchestrate/vm/cbt.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <utility>

#include <nlohmann/json.hpp>

#include "blockio/path.h"
#include "formats/json_fields.h"
#include "formats/qcow2_writer.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/libvirt/remote_files.h"
#include "pipeline/cbt_overlay.h"

namespace barge::orchestrate {
namespace {

using nlohmann::json;

struct CbtRow {
  std::string state_dir;
  std::string original_xml;
  std::vector<CbtDisk> disks;
  std::string host;  // RedactLibvirtUri of the domain's host; "" = this machine
};

Result<std::optional<CbtRow>> LoadRow(BackupCatalog& catalog, const std::string& domain) {
  // The table (and its host column) is the catalog's, made or upgraded at
  // open (BackupCatalog::Migrate).
  BARGE_ASSIGN_OR_RETURN(auto st, catalog.db().Prepare(
      "SELECT state_dir, original_xml, disks, host FROM vm_cbt WHERE domain=?"));
  st.Bind(1, domain);
  BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return std::optional<CbtRow>();
  CbtRow r{st.Text(0), st.Text(1), {}, st.Text(3)};
  json a = json::parse(st.Text(2), nullptr, false);
  if (a.is_array()) {
    for (const auto& j : a) {
      if (!j.is_object()) return Error::Corruption("catalog: vm_cbt.disks of domain '" + domain + "' is damaged");
      r.disks.push_back({formats::JsonString(j, "disk"), formats::JsonString(j, "data_file"),
                         formats::JsonString(j, "overlay"), formats::JsonString(j, "original_owner")});
    }
  }
  return std::optional<CbtRow>(std::move(r));
}

std::string ReplaceOnce(std::string s, const std::string& from, const std::string& to) {
  size_t p = s.find(from);
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

// The disk element with its driver type and source file switched.
std::string SwitchDisk(const DomainDisk& d, const std::string& new_format, const std::string& new_source) {
  std::string el = d.element;
  for (char q : {'\'', '"'}) {
    std::string qs(1, q);
    el = ReplaceOnce(el, "type=" + qs + d.format + qs, "type=" + qs + new_format + qs);
    el = ReplaceOnce(el, "file=" + qs + XmlEscape(d.source) + qs, "file=" + qs + XmlEscape(new_source) + qs);
    el = ReplaceOnce(el, "file=" + qs + d.source + qs, "file=" + qs + new_source + qs);
  }
  return el;
}

Result<VirDomain> Domain(virConnectPtr conn, const std::string& name) { return LookupDomain(conn, name); }

}  // namespace

std::optional<std::pair<uid_t, gid_t>> ParseDacLabel(std::string label) {
  label.erase(std::remove(label.begin(), label.end(), '+'), label.end());
  size_t colon = label.find(':');
  if (colon == std::string::npos) return std::nullopt;
  try {
    return std::make_pair(static_cast<uid_t>(std::stoul(label.substr(0, colon))),
                          static_cast<gid_t>(std::stoul(label.substr(colon + 1))));
  } catch (...) {
    return std::nullopt;
  }
}

std::string ElementText(const std::string& xml, const std::string& tag, size_t from) {
  size_t a = xml.find("<" + tag, from);
  if (a == std::string::npos) return "";
  a = xml.find('>', a);
  size_t b = xml.find("</" + tag + ">", a);
  if (a == std::string::npos || b == std::string::npos) return "";
  return xml.substr(a + 1, b - a - 1);
}

std::optional<std::pair<uid_t, gid_t>> QemuDacOwner(virConnectPtr conn, const std::string& domain_xml) {
  for (size_t p = domain_xml.find("<seclabel"); p != std::string::npos; p = domain_xml.find("<seclabel", p + 1)) {
    size_t end = domain_xml.find('>', p);
    std::string open = domain_xml.substr(p, end - p);
    if (open.find("model='dac'") == std::string::npos && open.find("model=\"dac\"") == std::string::npos) continue;
    if (auto owner = ParseDacLabel(ElementText(domain_xml, "label", p))) return owner;
  }
  char* caps = virConnectGetCapabilities(conn);
  if (caps == nullptr) return std::nullopt;
  std::string c(caps);
  free(caps);
  std::string type = domain_xml.find("type='kvm'") != std::string::npos ? "kvm" : "qemu";
  size_t dac = c.find("<model>dac</model>");
  if (dac == std::string::npos) return std::nullopt;
  size_t label = c.find("<baselabel type='" + type + "'>", dac);
  if (label == std::string::npos) return std::nullopt;
  return ParseDacLabel(ElementText(c, "baselabel", label));
}

namespace {

// True when `owner` can read and write the file as its mode bits stand.
bool OwnerCanReadWrite(const FileStat& st, std::pair<uid_t, gid_t> owner) {
  if (owner.first == 0) return true;
  if (st.uid == owner.first) return (st.mode & S_IRUSR) && (st.mode & S_IWUSR);
  if (st.gid == owner.second) return (st.mode & S_IRGRP) && (st.mode & S_IWGRP);
  return (st.mode & S_IROTH) && (st.mode & S_IWOTH);
}

}  // namespace

Result<CbtStatus> GetCbtStatus(Env& env, const CbtRequest& req) {
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env, req.catalog_path));
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, Domain(conn.get(), req.domain));
  BARGE_ASSIGN_OR_RETURN(auto row, LoadRow(*catalog, req.domain));
  CbtStatus s;
  s.domain = req.domain;
  bool enabled = row.has_value();
  if (row) {
    s.state_dir = row->state_dir;
    s.disks = row->disks;
    s.host = row->host;
  }
  s.state = enabled ? "Enabled" : "Disabled";
  if (DomainIsActive(dom.get())) {
    // The live XML shows what the running QEMU uses.
    BARGE_ASSIGN_OR_RETURN(auto live, DomainDisks(dom.get()));
    bool live_on_overlay = false;
    for (const auto& d : live) {
      for (const auto& c : s.disks) live_on_overlay |= (d.source == c.overlay);
    }
    if (live_on_overlay != enabled) s.state = "PendingRestart";
  }
  return s;
}

namespace {

// The catalog row of a domain now on its overlays; on failure the domain
// is defined with `xml` (its definition before enable) again, and the
// error says so if that fails too.
Status InsertRow(BackupCatalog& catalog, virConnectPtr conn, const CbtRequest& req, const std::string& state_dir,
                 const std::string& xml, const std::vector<CbtDisk>& done, const std::string& host) {
  json disks = json::array();
  for (const auto& d : done) {
    disks.push_back({{"disk", d.disk}, {"data_file", d.data_file}, {"overlay", d.overlay},
                     {"original_owner", d.original_owner}});
  }
  Status inserted = [&]() -> Status {
    BARGE_ASSIGN_OR_RETURN(std::string disks_text,
                           formats::DumpJson(disks, -1, "the CBT record of domain '" + req.domain + "'"));
    BARGE_ASSIGN_OR_RETURN(auto ins, catalog.db().Prepare(
        "INSERT INTO vm_cbt(domain, state_dir, original_xml, disks, enabled_at, host) VALUES(?,?,?,?,?,?)"));
    ins.Bind(1, req.domain).Bind(2, state_dir).Bind(3, xml).Bind(4, disks_text).Bind(5, formats::NowRfc3339());
    ins.Bind(6, host);
    return ins.Run();
  }();
  if (inserted.ok()) return inserted;
  Error e = std::move(inserted).error();
  virDomainPtr back = virDomainDefineXML(conn, xml.c_str());
  if (back) {
    virDomainFree(back);
  } else {
    e.Also(LastVirError("define domain with its original XML again"));
  }
  return e;
}

// Where the CBT overlay of raw disk `raw` goes on a remote host: beside it.
std::string RemoteOverlayName(const std::string& raw) { return BaseName(raw) + ".cbt.qcow2"; }

// enable for a domain on another host (`host`: its URI without secrets):
// each raw disk's overlay is made here, piece by piece (never whole in
// memory), and put beside the raw disk through libvirt's storage API (a
// pool over the disk's folder, a volume per overlay), each piece written
// and read back, its header block last, before the domain is defined on
// it. Every failure removes the volumes
// made. barge cannot change a remote file's owner: a raw disk QEMU's user
// cannot read and write is refused (nothing changed).
Result<CbtStatus> EnableRemote(Env& env, const CbtRequest& req, BackupCatalog& catalog, virConnectPtr conn,
                               const std::string& xml, const std::string& host) {
  struct Folder {
    VirPool pool;
    std::string transient;  // the pool this enable made, stopped at the end
  };
  std::vector<Folder> folders;
  std::vector<std::pair<virStoragePoolPtr, std::string>> made;  // volumes created
  auto close = [&folders](Error* e) {
    for (Folder& f : folders) {
      Status c = CloseRemoteFolder(f.pool.get(), f.transient);
      if (e != nullptr) e->Also(c);
    }
    folders.clear();
  };
  auto undo = [&](Error e) -> Error {
    for (const auto& [pool, name] : made) e.Also(DeleteRemoteFile(pool, name));
    close(&e);
    return e;
  };
  const auto qemu_owner = QemuDacOwner(conn, xml);
  std::string new_xml = xml;
  std::vector<CbtDisk> done;
  for (const auto& d : ParseDomainDisks(xml)) {
    if (d.format != "raw" || d.source_type != "file" || d.source.empty()) continue;
    if (!IsAbsolutePath(d.source)) {
      return undo(Error::InvalidArgument("disk " + d.target + " of domain '" + req.domain +
                                         "' names a relative path on " + host + ": " + d.source));
    }
    const std::string folder = DirName(d.source), raw = BaseName(d.source);
    Folder f;
    auto pool = OpenRemoteFolder(conn, folder, "barge-cbt-" + EscapeLockName(req.domain) + "-" + d.target,
                                 &f.transient);
    if (!pool.ok()) return undo(std::move(pool).error().Wrap("CBT overlay for " + d.target));
    f.pool = std::move(*pool);
    virStoragePoolPtr p = f.pool.get();
    folders.push_back(std::move(f));
    auto info = StatRemoteFile(p, raw);
    if (!info.ok()) return undo(std::move(info).error().Wrap("CBT overlay for " + d.target));
    FileStat st;
    st.mode = info->mode;
    st.uid = info->uid;
    st.gid = info->gid;
    if (qemu_owner && info->has_owner && !OwnerCanReadWrite(st, *qemu_owner)) {
      char mode[16];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info->mode));
      return undo(Error::InvalidArgument(
          "QEMU's user (" + std::to_string(qemu_owner->first) + ":" + std::to_string(qemu_owner->second) +
          ") cannot read and write the raw disk " + d.source + " on " + host + " (owner " +
          std::to_string(info->uid) + ":" + std::to_string(info->gid) + ", mode " + mode +
          "), and barge cannot change the owner of a file on another host: let that user read and write it "
          "there, then enable CBT (nothing changed)"));
    }
    formats::BitmapSpec b;
    b.name = kCbtBitmapName;
    b.enabled = true;
    // A first pass passes nothing on: the volume is made at the overlay's
    // size before any of it goes up (making it again costs far less than
    // holding it).
    auto image = pipeline::StreamCbtOverlay(d.source, info->size, 16, {b},
                                            [](uint64_t, std::span<const std::byte>) { return OkStatus(); });
    if (!image.ok()) return undo(std::move(image).error().Wrap("CBT overlay for " + d.target));
    const std::string name = RemoteOverlayName(d.source);
    if (RemoteFileExists(p, name)) {
      // An enable killed during its upload leaves a file whose header block
      // is still zeros: replaced. Anything else is not barge's to delete.
      const std::vector<std::byte> zeros(std::min<uint64_t>(pipeline::kCbtOverlayHeadBytes, image->size_bytes));
      if (!CheckRemoteFile(p, name, 0, zeros).ok()) {
        return undo(Error::InvalidArgument(JoinPath(folder, name) + " exists on " + host +
                                           ": not replacing a file barge did not leave (nothing changed)"));
      }
    }
    Status put = [&]() -> Status {
      BARGE_RETURN_IF_ERROR(CreateRemoteFile(p, name, "raw", image->size_bytes, 0644));
      made.emplace_back(p, name);
      // The header block comes last (StreamCbtOverlay), so a write cut
      // short leaves a file that is no qcow2 image (and no domain is
      // defined on it); each piece is read back before the next goes up.
      auto sent = pipeline::StreamCbtOverlay(d.source, info->size, 16, {b},
                                             [&](uint64_t offset, std::span<const std::byte> bytes) -> Status {
                                               BARGE_RETURN_IF_ERROR(UploadRemoteFile(p, name, offset, bytes));
                                               return CheckRemoteFile(p, name, offset, bytes);
                                             });
      if (!sent.ok()) return std::move(sent).error();
      return OkStatus();
    }();
    if (!put.ok()) return undo(std::move(put).error().Wrap("CBT overlay for " + d.target + " on " + host));
    const std::string overlay = JoinPath(folder, name);
    done.push_back({d.target, d.source, overlay, ""});
    new_xml = ReplaceOnce(new_xml, d.element, SwitchDisk(d, "qcow2", overlay));
  }
  if (done.empty()) return undo(Error::InvalidArgument("domain '" + req.domain + "' has no raw file disks"));
  virDomainPtr defined = virDomainDefineXML(conn, new_xml.c_str());
  if (!defined) return undo(LastVirError("define domain on CBT overlays"));
  virDomainFree(defined);
  if (Status s = InsertRow(catalog, conn, req, "", xml, done, host); !s.ok()) return undo(std::move(s).error());
  close(nullptr);
  return GetCbtStatus(env, req);
}

}  // namespace

Result<CbtStatus> EnableCbt(Env& env, const CbtRequest& req) {
  const std::string uri = ResolveLibvirtUri(req.libvirt_uri);
  const bool remote = !LibvirtHostKey(uri).empty();
  if (remote && !req.state_dir.empty()) {
    return Error::InvalidArgument("--state-dir is for a domain on this machine: the CBT overlays of a domain on " +
                                  RedactLibvirtUri(uri) + " go beside its raw disks on that host");
  }
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env, req.catalog_path));
  // No backup or state migration of the domain meanwhile.
  BARGE_ASSIGN_OR_RETURN(auto lock, TryLockFile(env, DomainLockPath(req.catalog_path, req.domain),
                                                DomainBusyMessage(req.domain)));
  BARGE_ASSIGN_OR_RETURN(auto row, LoadRow(*catalog, req.domain));
  if (row) return Error::InvalidArgument("CBT is already enabled for domain '" + req.domain + "'");
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, Domain(conn.get(), req.domain));
  // The raw disk of a running domain is labelled by libvirt for the running
  // QEMU: libvirt gives it back to its remembered owner when the domain
  // stops, after which QEMU (on the overlay) could no longer open it. Only
  // a shut-off domain can be switched safely. This check and the define
  // below are not atomic: a domain started in between (by virsh, not by
  // barge, which the domain lock keeps out) is not caught, and runs on the
  // old definition until its next start.
  if (DomainIsActive(dom.get())) {
    return Error::InvalidArgument("domain '" + req.domain +
                                  "' is running: shut it down first, then enable CBT (nothing changed)");
  }
  BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom.get(), VIR_DOMAIN_XML_INACTIVE | VIR_DOMAIN_XML_SECURE));
  if (remote) return EnableRemote(env, req, *catalog, conn.get(), xml, RedactLibvirtUri(uri));
  std::string state_dir = req.state_dir.empty() ? CatalogDir(req.catalog_path) + "/cbt/" + req.domain
                                                : req.state_dir;
  if (Status made = env.CreateDirs(state_dir); !made.ok()) {
    return std::move(made).error().Wrap("create state folder");
  }
  BARGE_ASSIGN_OR_RETURN(state_dir, env.RealPath(state_dir));
  // QEMU (another user) opens the overlays: the folder must be readable
  // and traversable by others.
  BARGE_ASSIGN_OR_RETURN(FileStat dir_st, env.Stat(state_dir));
  if ((dir_st.mode & 0005) != 0005) BARGE_RETURN_IF_ERROR(env.SetMode(state_dir, (dir_st.mode & 07777) | 0755));

  std::string new_xml = xml;
  std::vector<CbtDisk> done;
  // libvirt 9 labels the overlay when the domain starts but not the data
  // file QEMU then opens by itself: hand the raw disk to QEMU's user now
  // (as libvirt's dynamic ownership would for the raw disk itself) and give
  // it back on disable.
  const auto qemu_owner = QemuDacOwner(conn.get(), xml);
  // Undoes what was done so far; what cannot be undone is added to `e`.
  auto undo = [&](Error e) -> Error {
    for (const auto& d : done) {
      e.Also(env.UnlinkIfExists(d.overlay));
      if (auto o = ParseDacLabel(d.original_owner)) e.Also(env.SetOwner(d.data_file, o->first, o->second));
    }
    return e;
  };
  for (const auto& d : ParseDomainDisks(xml)) {
    if (d.format != "raw" || d.source_type != "file" || d.source.empty()) continue;
    pipeline::CbtOverlayRequest oreq;
    oreq.data_file = d.source;
    oreq.overlay = state_dir + "/" + d.target + ".qcow2";
    oreq.refuse_image_data = false;  // libvirt's format='raw': the bytes are the guest's
    formats::BitmapSpec b;
    b.name = kCbtBitmapName;
    b.enabled = true;
    oreq.bitmaps.push_back(b);
    auto made = pipeline::CreateCbtOverlay(env, oreq);
    if (!made.ok()) return undo(std::move(made).error().Wrap("CBT overlay for " + d.target));
    const std::string data = made->data_file;
    const std::string& overlay = oreq.overlay;
    const FileStat& st = made->data_stat;
    done.push_back({d.target, data, overlay, ""});
    // The process's umask may have narrowed the new file's mode.
    if (Status m = env.SetMode(overlay, 0644); !m.ok()) return undo(std::move(m).error());
    if (qemu_owner && !OwnerCanReadWrite(st, *qemu_owner)) {
      if (Status c = env.SetOwner(data, qemu_owner->first, qemu_owner->second); !c.ok()) {
        Error e = std::move(c).error().Wrap("give QEMU's user (" + std::to_string(qemu_owner->first) + ":" +
                                            std::to_string(qemu_owner->second) + ") the raw disk");
        return undo(std::move(e.Wrap("CBT for " + d.target +
                                     " (run as root, or let that user read and write the file)")));
      }
      done.back().original_owner = std::to_string(st.uid) + ":" + std::to_string(st.gid);
    }
    new_xml = ReplaceOnce(new_xml, d.element, SwitchDisk(d, "qcow2", overlay));
  }
  if (done.empty()) return Error::InvalidArgument("domain '" + req.domain + "' has no raw file disks");
  virDomainPtr defined = virDomainDefineXML(conn.get(), new_xml.c_str());
  if (!defined) return undo(LastVirError("define domain on CBT overlays"));
  virDomainFree(defined);
  if (Status s = InsertRow(*catalog, conn.get(), req, state_dir, xml, done, ""); !s.ok()) {
    return undo(std::move(s).error());
  }
  return GetCbtStatus(env, req);
}

Result<CbtStatus> DisableCbt(Env& env, const CbtRequest& req) {
  const std::string uri = ResolveLibvirtUri(req.libvirt_uri);
  const bool remote = !LibvirtHostKey(uri).empty();
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env, req.catalog_path));
  // No backup or state migration of the domain meanwhile.
  BARGE_ASSIGN_OR_RETURN(auto lock, TryLockFile(env, DomainLockPath(req.catalog_path, req.domain),
                                                DomainBusyMessage(req.domain)));
  // The domain first: one libvirt does not know is named as such (kNotFound),
  // not reported as one without CBT.
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, Domain(conn.get(), req.domain));
  BARGE_ASSIGN_OR_RETURN(auto row, LoadRow(*catalog, req.domain));
  if (!row) return Error::InvalidArgument("CBT is not enabled for domain '" + req.domain + "'");
  // The record's paths are those of the host enable ran against.
  if (LibvirtHostKey(row->host) != LibvirtHostKey(uri)) {
    const std::string where = row->host.empty() ? "this machine" : row->host;
    return Error::InvalidArgument("CBT of domain '" + req.domain + "' was enabled on " + where + ", not on " +
                                  (remote ? RedactLibvirtUri(uri) : std::string("this machine")) +
                                  ": disable it there" +
                                  (row->host.empty() ? std::string() : " (--connect " + row->host + ")") +
                                  " (nothing changed)");
  }
  // A running QEMU has the overlays and the raw disks open (labelled for
  // it): switching back is only safe on a shut-off domain. As in enable,
  // a domain started between this check and the define is not caught.
  if (DomainIsActive(dom.get())) {
    return Error::InvalidArgument("domain '" + req.domain +
                                  "' is running on its CBT overlays: shut it down first, then disable CBT "
                                  "(nothing changed)");
  }
  // Only the disks enable moved onto overlays go back, on the definition as
  // it is now: every other change made since enable stays.
  BARGE_ASSIGN_OR_RETURN(std::string now_xml,
                         DomainXml(dom.get(), VIR_DOMAIN_XML_INACTIVE | VIR_DOMAIN_XML_SECURE));
  const auto now_disks = ParseDomainDisks(now_xml);
  const auto original_disks = ParseDomainDisks(row->original_xml);
  std::string new_xml = now_xml;
  for (const auto& c : row->disks) {
    auto d = std::find_if(now_disks.begin(), now_disks.end(), [&](const DomainDisk& x) { return x.target == c.disk; });
    if (d == now_disks.end()) {
      return Error::InvalidArgument("domain '" + req.domain + "' has no disk " + c.disk +
                                    " any more (CBT put it on overlay " + c.overlay +
                                    "): not disabling, the definition was changed since enable (nothing changed)");
    }
    if (d->source_type != "file" || d->source != c.overlay || d->format != "qcow2") {
      return Error::InvalidArgument("disk " + c.disk + " of domain '" + req.domain + "' is now " + d->format +
                                    " " + (d->source.empty() ? "(no source)" : d->source) +
                                    ", not the CBT overlay " + c.overlay +
                                    " (qcow2): not disabling, the definition was changed since enable "
                                    "(nothing changed)");
    }
    // The raw disk's path as the definition named it before enable (a
    // link, say), while it still leads to the raw disk CBT recorded; once
    // that path no longer does (state migrate moved the raw disk's folder,
    // and the record with it), the recorded raw disk.
    std::string raw = c.data_file;
    for (const auto& o : original_disks) {
      // A remote host's paths are recorded as its libvirt named them.
      if (remote || o.target != c.disk || o.source.empty()) continue;
      if (auto real = env.RealPath(o.source); real.ok() && *real == c.data_file) raw = o.source;
    }
    new_xml = ReplaceOnce(new_xml, d->element, SwitchDisk(*d, "raw", raw));
  }
  virDomainPtr defined = virDomainDefineXML(conn.get(), new_xml.c_str());
  if (!defined) return LastVirError("define domain back on its raw disks");
  virDomainFree(defined);
  BARGE_ASSIGN_OR_RETURN(auto del, catalog->db().Prepare("DELETE FROM vm_cbt WHERE domain=?"));
  del.Bind(1, req.domain);
  BARGE_RETURN_IF_ERROR(del.Run());
  // From here on CBT is disabled; what cannot be cleaned up is reported.
  std::optional<Error> left;
  auto note = [&left](Status s) {
    if (s.ok()) return;
    if (!left) left = Error(s.error()).Wrap("CBT is disabled, but cleaning up failed");
    else left->Also(s);
  };
  if (remote) {
    // The overlays' volumes, through a pool over each one's folder.
    for (const auto& d : row->disks) {
      std::string transient;
      auto pool = OpenRemoteFolder(conn.get(), DirName(d.overlay),
                                   "barge-cbt-" + EscapeLockName(req.domain) + "-" + d.disk, &transient);
      if (!pool.ok()) {
        note(std::move(pool).error().Wrap("remove " + d.overlay + " on " + row->host));
        continue;
      }
      note(DeleteRemoteFile(pool->get(), BaseName(d.overlay)));
      note(CloseRemoteFolder(pool->get(), transient));
    }
  } else {
    for (const auto& d : row->disks) note(env.UnlinkIfExists(d.overlay));
  }
  // The raw disk goes back to its owner from before enable (libvirt's own
  // dynamic ownership takes over again for the raw disk).
  for (const auto& d : row->disks) {
    if (auto o = ParseDacLabel(d.original_owner)) note(env.SetOwner(d.data_file, o->first, o->second));
  }
  if (left) return *left;
  return GetCbtStatus(env, req);
}

Result<std::optional<std::vector<CbtDisk>>> CbtDisksOf(BackupCatalog& catalog, const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(auto row, LoadRow(catalog, domain));
  if (!row) return std::optional<std::vector<CbtDisk>>();
  return std::optional<std::vector<CbtDisk>>(std::move(row->disks));
}

Status RepointCbtPaths(BackupCatalog& catalog, const std::vector<std::string>& old_dirs, const std::string& new_dir) {
  struct Row {
    std::string domain, state_dir, original_xml, disks;
    bool operator==(const Row&) const = default;
  };
  std::vector<Row> changed;
  {
    BARGE_ASSIGN_OR_RETURN(auto sel, catalog.db().Prepare(
        // A remote domain's files are its host's: a folder moved here
        // says nothing of them.
        "SELECT domain, state_dir, original_xml, disks FROM vm_cbt WHERE host=''"));
    for (;;) {
      BARGE_ASSIGN_OR_RETURN(bool more, sel.Step());
      if (!more) break;
      const Row was{sel.Text(0), sel.Text(1), sel.Text(2), sel.Text(3)};
      Row now = was;
      for (const std::string& old_dir : old_dirs) {
        now.state_dir = MovePath(now.state_dir, old_dir, new_dir);
        now.original_xml = ReplacePathPrefix(now.original_xml, old_dir, new_dir, /*xml=*/true);
        now.disks = ReplacePathPrefix(now.disks, old_dir, new_dir, /*xml=*/false);
      }
      if (!(now == was)) changed.push_back(std::move(now));
    }
  }
  for (const Row& r : changed) {
    BARGE_ASSIGN_OR_RETURN(auto upd, catalog.db().Prepare(
        "UPDATE vm_cbt SET state_dir=?, original_xml=?, disks=? WHERE domain=?"));
    upd.Bind(1, r.state_dir).Bind(2, r.original_xml).Bind(3, r.disks).Bind(4, r.domain);
    BARGE_RETURN_IF_ERROR(upd.Run());
  }
  return OkStatus();
}

}  // namespace barge::orchestrate
