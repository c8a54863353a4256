// CBT enable/disable/status over libvirt domain definitions.
#include "orchestrate/cbt.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "formats/qcow2_writer.h"
#include "pipeline/staged_file.h"

namespace barge::orchestrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kCbtSchema = R"sql(
CREATE TABLE IF NOT EXISTS vm_cbt (
  domain TEXT PRIMARY KEY,
  state_dir TEXT NOT NULL,
  original_xml TEXT NOT NULL,
  disks TEXT NOT NULL,
  enabled_at TEXT NOT NULL
);
)sql";

struct CbtRow {
  std::string state_dir;
  std::string original_xml;
  std::vector<CbtDisk> disks;
};

Result<std::optional<CbtRow>> LoadRow(BackupCatalog& catalog, const std::string& domain) {
  BARGE_RETURN_IF_ERROR(catalog.db().Exec(kCbtSchema));
  BARGE_ASSIGN_OR_RETURN(auto st, catalog.db().Prepare(
      "SELECT state_dir, original_xml, disks FROM vm_cbt WHERE domain=?"));
  st.Bind(1, domain);
  BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return std::optional<CbtRow>();
  CbtRow r{st.Text(0), st.Text(1), {}};
  json a = json::parse(st.Text(2), nullptr, false);
  if (a.is_array()) {
    for (const auto& j : a) {
      r.disks.push_back({j.value("disk", ""), j.value("data_file", ""), j.value("overlay", "")});
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

Result<CbtStatus> GetCbtStatus(const CbtRequest& req) {
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(req.catalog_path));
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, Domain(conn.get(), req.domain));
  BARGE_ASSIGN_OR_RETURN(auto row, LoadRow(*catalog, req.domain));
  CbtStatus s;
  s.domain = req.domain;
  bool enabled = row.has_value();
  if (row) {
    s.state_dir = row->state_dir;
    s.disks = row->disks;
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

Result<CbtStatus> EnableCbt(const CbtRequest& req) {
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(req.catalog_path));
  BARGE_ASSIGN_OR_RETURN(auto row, LoadRow(*catalog, req.domain));
  if (row) return Error::InvalidArgument("CBT is already enabled for domain '" + req.domain + "'");
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, Domain(conn.get(), req.domain));
  BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom.get(), VIR_DOMAIN_XML_INACTIVE | VIR_DOMAIN_XML_SECURE));
  std::string state_dir = req.state_dir.empty() ? CatalogDir(req.catalog_path) + "/cbt/" + req.domain
                                                : req.state_dir;
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) return Error::FromErrno(ec.value(), "create state folder", state_dir);
  state_dir = fs::canonical(state_dir, ec).string();
  ::chmod(state_dir.c_str(), 0755);

  std::string new_xml = xml;
  std::vector<CbtDisk> done;
  auto undo = [&] {
    for (const auto& d : done) fs::remove(d.overlay, ec);
  };
  for (const auto& d : ParseDomainDisks(xml)) {
    if (d.format != "raw" || d.source_type != "file" || d.source.empty()) continue;
    std::string data = fs::canonical(d.source, ec).string();
    if (ec) {
      undo();
      return Error::FromErrno(ec.value(), "resolve raw disk", d.source);
    }
    struct stat st;
    if (::stat(data.c_str(), &st) != 0) {
      undo();
      return Error::FromErrno(errno, "stat", data);
    }
    formats::OverlayOptions o;
    o.virtual_size = static_cast<uint64_t>(st.st_size) & ~uint64_t{511};
    o.data_file_path = data;
    formats::BitmapSpec b;
    b.name = kCbtBitmapName;
    b.enabled = true;
    o.bitmaps.push_back(b);
    std::string overlay = state_dir + "/" + d.target + ".qcow2";
    auto staged = pipeline::StagedFile::Create(overlay);
    if (!staged.ok()) {
      undo();
      return staged.error();
    }
    Status s = formats::WriteDataFileOverlay((*staged)->sink(), o);
    if (s.ok()) s = (*staged)->Commit();
    if (!s.ok()) {
      undo();
      return Error(s.error()).Wrap("CBT overlay for " + d.target);
    }
    // QEMU opens the data file itself (libvirt 9 does not label it): give
    // it the overlay's owner once libvirt labels that.
    ::chmod(overlay.c_str(), 0644);
    done.push_back({d.target, data, overlay});
    new_xml = ReplaceOnce(new_xml, d.element, SwitchDisk(d, "qcow2", overlay));
  }
  if (done.empty()) return Error::InvalidArgument("domain '" + req.domain + "' has no raw file disks");
  virDomainPtr defined = virDomainDefineXML(conn.get(), new_xml.c_str());
  if (!defined) {
    Error e = LastVirError("define domain on CBT overlays");
    undo();
    return e;
  }
  virDomainFree(defined);
  json disks = json::array();
  for (const auto& d : done) disks.push_back({{"disk", d.disk}, {"data_file", d.data_file}, {"overlay", d.overlay}});
  BARGE_ASSIGN_OR_RETURN(auto ins, catalog->db().Prepare(
      "INSERT INTO vm_cbt(domain, state_dir, original_xml, disks, enabled_at) VALUES(?,?,?,?,?)"));
  ins.Bind(1, req.domain).Bind(2, state_dir).Bind(3, xml).Bind(4, disks.dump()).Bind(5, formats::NowRfc3339());
  if (Status s = ins.Run(); !s.ok()) {
    virDomainPtr back = virDomainDefineXML(conn.get(), xml.c_str());
    if (back) virDomainFree(back);
    undo();
    return s.error();
  }
  return GetCbtStatus(req);
}

Result<CbtStatus> DisableCbt(const CbtRequest& req) {
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(req.catalog_path));
  BARGE_ASSIGN_OR_RETURN(auto row, LoadRow(*catalog, req.domain));
  if (!row) return Error::InvalidArgument("CBT is not enabled for domain '" + req.domain + "'");
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, Domain(conn.get(), req.domain));
  virDomainPtr defined = virDomainDefineXML(conn.get(), row->original_xml.c_str());
  if (!defined) return LastVirError("define domain with its original XML");
  virDomainFree(defined);
  BARGE_ASSIGN_OR_RETURN(auto del, catalog->db().Prepare("DELETE FROM vm_cbt WHERE domain=?"));
  del.Bind(1, req.domain);
  BARGE_RETURN_IF_ERROR(del.Run());
  // A running QEMU still has the overlays open; they go when it stops.
  if (!DomainIsActive(dom.get())) {
    std::error_code ec;
    for (const auto& d : row->disks) fs::remove(d.overlay, ec);
  }
  return GetCbtStatus(req);
}

Result<std::optional<std::vector<CbtDisk>>> CbtDisksOf(BackupCatalog& catalog, const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(auto row, LoadRow(catalog, domain));
  if (!row) return std::optional<std::vector<CbtDisk>>();
  return std::optional<std::vector<CbtDisk>>(std::move(row->disks));
}

}  // namespace barge::orchestrate
