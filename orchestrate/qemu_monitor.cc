// QMP passthrough for internal snapshots of a running domain's disk.
#include "orchestrate/qemu_monitor.h"

#include <libvirt/libvirt-qemu.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "orchestrate/libvirt_conn.h"

namespace barge::orchestrate {
namespace {

using nlohmann::json;

formats::SnapshotInfo FromQemu(const json& s) {
  formats::SnapshotInfo info;
  info.id = s.value("id", "");
  info.name = s.value("name", "");
  info.vm_state_size = s.value("vm-state-size", uint64_t{0});
  info.date_sec = static_cast<uint32_t>(s.value("date-sec", uint64_t{0}));
  info.date_nsec = static_cast<uint32_t>(s.value("date-nsec", uint64_t{0}));
  info.vm_clock_nsec = s.value("vm-clock-sec", uint64_t{0}) * 1000000000ull + s.value("vm-clock-nsec", uint64_t{0});
  if (s.contains("icount")) info.icount = s["icount"].get<uint64_t>();
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
    return Error::InvalidArgument("QEMU: " + (e.is_object() ? e.value("desc", e.dump()) : e.dump()));
  }
  return j.contains("return") ? j["return"].dump() : std::string("{}");
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
    if (!d.contains("inserted")) continue;
    const std::string qdev = d.value("qdev", "");
    const bool by_alias = !alias.empty() && (qdev == alias || qdev.find("/" + alias + "/") != std::string::npos ||
                                             d.value("device", "") == "drive-" + alias);
    const bool by_file = !disk->source.empty() && d["inserted"].value("file", "") == disk->source;
    if (by_alias || (!found && by_file)) found = &d;
    if (by_alias) break;
  }
  if (!found) {
    return Error::NotFound("QEMU does not list disk '" + target + "' of domain '" +
                           std::string(virDomainGetName(dom)) + "' (query-block)");
  }
  const json& inserted = (*found)["inserted"];
  QemuDisk out;
  out.node_name = inserted.value("node-name", "");
  out.qdev = found->value("qdev", "");
  out.file = inserted.value("file", "");
  out.format = inserted.value("drv", "");
  if (out.node_name.empty()) out.node_name = found->value("device", "");
  if (inserted.contains("image") && inserted["image"].contains("snapshots")) {
    for (const json& s : inserted["image"]["snapshots"]) out.snapshots.push_back(FromQemu(s));
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
