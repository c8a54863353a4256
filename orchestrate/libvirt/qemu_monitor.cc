// QMP passthrough for internal snapshots of a running domain's disk.
#include "orchestrate/libvirt/qemu_monitor.h"

#include <libvirt/libvirt-qemu.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "formats/json_fields.h"
#include "orchestrate/libvirt/libvirt_conn.h"

namespace barge::orchestrate {
namespace {

using nlohmann::json;

formats::SnapshotInfo FromQemu(const json& s) {
  formats::SnapshotInfo info;
  // A field QEMU leaves out, or sends with another type, reads as empty.
  info.id = formats::JsonString(s, "id");
  info.name = formats::JsonString(s, "name");
  info.vm_state_size = formats::JsonUint(s, "vm-state-size");
  info.date_sec = static_cast<uint32_t>(formats::JsonUint(s, "date-sec"));
  info.date_nsec = static_cast<uint32_t>(formats::JsonUint(s, "date-nsec"));
  info.vm_clock_nsec = formats::JsonUint(s, "vm-clock-sec") * 1000000000ull + formats::JsonUint(s, "vm-clock-nsec");
  if (s.is_object() && s.contains("icount") && s["icount"].is_number_unsigned()) {
    info.icount = s["icount"].get<uint64_t>();
  }
  return info;
}

}  // namespace

Result<std::string> QmpCommand(virDomainPtr dom, const std::string& command_json) {
  char* reply = nullptr;
  if (virDomainQemuMonitorCommand(dom, command_json.c_str(), &reply, 0) < 0) {
    return LastVirError("QEMU monitor command");
  }
  std::string text = reply ? reply : "";
  std::free(reply);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Error::IoError("QEMU monitor: unreadable reply to " + command_json + ": " + text);
  }
  if (j.contains("error")) {
    const json& e = j["error"];
    const std::string text = formats::DumpJsonForDisplay(e);
    return Error::InvalidArgument("QEMU: " + formats::JsonString(e, "desc", text));
  }
  return j.contains("return") ? formats::DumpJsonForDisplay(j["return"]) : std::string("{}");
}

Result<QemuDisk> FindQemuDisk(virDomainPtr dom, const std::string& target) {
  BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom));
  const DomainDisk* disk = nullptr;
  std::vector<DomainDisk> disks = ParseDomainDisks(xml);
  for (const DomainDisk& d : disks) {
    if (d.target == target) disk = &d;
  }
  if (!disk) {
    return Error::NotFound("domain '" + std::string(virDomainGetName(dom)) + "' has no disk '" + target + "'");
  }
  const std::string alias = XmlAttr(disk->element, "alias", "name");
  BARGE_ASSIGN_OR_RETURN(std::string reply, QmpCommand(dom, R"({"execute":"query-block"})"));
  json devices = json::parse(reply, nullptr, false);
  if (!devices.is_array()) return Error::IoError("QEMU monitor: query-block did not return a list");
  const json* found = nullptr;
  for (const json& d : devices) {
    if (!d.is_object() || !d.contains("inserted") || !d["inserted"].is_object()) continue;
    const std::string qdev = formats::JsonString(d, "qdev");
    const bool by_alias = !alias.empty() && (qdev == alias || qdev.find("/" + alias + "/") != std::string::npos ||
                                             formats::JsonString(d, "device") == "drive-" + alias);
    const bool by_file = !disk->source.empty() && formats::JsonString(d["inserted"], "file") == disk->source;
    if (by_alias || (!found && by_file)) found = &d;
    if (by_alias) break;
  }
  if (!found) {
    return Error::NotFound("QEMU does not list disk '" + target + "' of domain '" +
                           std::string(virDomainGetName(dom)) + "' (query-block)");
  }
  const json& inserted = (*found)["inserted"];
  QemuDisk out;
  out.node_name = formats::JsonString(inserted, "node-name");
  out.qdev = formats::JsonString(*found, "qdev");
  out.file = formats::JsonString(inserted, "file");
  out.format = formats::JsonString(inserted, "drv");
  if (out.node_name.empty()) out.node_name = formats::JsonString(*found, "device");
  if (inserted.contains("image") && inserted["image"].is_object() && inserted["image"].contains("snapshots") &&
      inserted["image"]["snapshots"].is_array()) {
    for (const json& s : inserted["image"]["snapshots"]) out.snapshots.push_back(FromQemu(s));
  }
  if (inserted.contains("dirty-bitmaps") && inserted["dirty-bitmaps"].is_array()) {
    for (const json& b : inserted["dirty-bitmaps"]) {
      if (!b.is_object()) continue;
      formats::BitmapInfo info;
      info.name = formats::JsonString(b, "name");
      if (b.contains("granularity") && b["granularity"].is_number_unsigned()) {
        info.granularity_bytes = b["granularity"].get<uint32_t>();
      }
      info.in_use = b.contains("inconsistent") && b["inconsistent"].is_boolean() && b["inconsistent"].get<bool>();
      info.enabled = b.contains("recording") && b["recording"].is_boolean() && b["recording"].get<bool>();
      out.bitmaps.push_back(std::move(info));
    }
  }
  return out;
}

Status QemuCreateInternalSnapshot(virDomainPtr dom, const QemuDisk& disk, const std::string& name) {
  json cmd = {{"execute", "blockdev-snapshot-internal-sync"},
              {"arguments", {{"device", disk.node_name}, {"name", name}}}};
  auto r = QmpCommand(dom, cmd.dump());
  if (!r.ok()) return std::move(r).error().Wrap("snapshot of '" + disk.file + "'");
  return OkStatus();
}

Result<formats::SnapshotInfo> QemuDeleteInternalSnapshot(virDomainPtr dom, const QemuDisk& disk,
                                                         const std::string& id, const std::string& name) {
  json args = {{"device", disk.node_name}, {"id", id}};
  if (!name.empty()) args["name"] = name;
  json cmd = {{"execute", "blockdev-snapshot-delete-internal-sync"}, {"arguments", args}};
  auto r = QmpCommand(dom, cmd.dump());
  if (!r.ok()) return std::move(r).error().Wrap("delete snapshot of '" + disk.file + "'");
  json j = json::parse(*r, nullptr, false);
  return j.is_object() ? FromQemu(j) : formats::SnapshotInfo{};
}

}  // namespace barge::orchestrate
