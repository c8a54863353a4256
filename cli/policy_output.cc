// Policy run reports as JSON and text (cli/policy_output.h).
#include "cli/policy_output.h"

#include <signal.h>

#include "cli/common.h"
#include "cli/interrupt.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::cli {

namespace orc = barge::orchestrate;
using nlohmann::json;

namespace {

json SourceJson(const orc::Policy& policy, const orc::SourceOutcome& o) {
  const orc::PolicySource* s = policy.FindSource(o.source);
  json j = {{"source", o.source},
            {"kind", s != nullptr ? std::string(orc::PolicySourceKindName(s->kind)) : ""},
            {"due", o.due.due},
            {"trigger", o.due.due ? json(std::string(orc::TriggerName(o.due.trigger))) : json(nullptr)},
            {"due_reason", o.due.why},
            {"coalesced_slots", o.due.coalesced_slots},
            {"next_run_at", o.due.next ? json(orc::FormatRfc3339(*o.due.next)) : json(nullptr)},
            {"ran", o.ran}};
  if (!o.ran) {
    j["result"] = "not_due";
    return j;
  }
  const orc::RunRecord& r = o.record;
  json points = json::array();
  for (const auto& p : r.points) points.push_back({{"chain_dir", p.chain_dir}, {"id", p.id}});
  j["result"] = r.result;
  j["record_id"] = r.id;
  j["target"] = r.target.empty() ? json(nullptr) : json(r.target);
  j["type"] = r.type.empty() ? json(nullptr) : json(r.type);
  j["type_reason"] = r.type_reason;
  j["started_at"] = r.started_at;
  j["finished_at"] = r.finished_at;
  j["duration_seconds"] = r.duration_seconds;
  j["bytes_read"] = r.bytes_read;
  j["bytes_written"] = r.bytes_written;
  j["error"] = r.error;
  j["retention"] = o.retention;
  j["offsite"] = o.offsite.empty() ? json(nullptr) : json(o.offsite);
  j["points"] = points;
  return j;
}

}  // namespace

json ShardJson(const orc::ShardSpec& shard) {
  if (!shard.sharded()) return nullptr;
  return {{"index", shard.index}, {"count", shard.count}};
}

json RunReportJson(const orc::Policy& policy, const orc::RunReport& report) {
  json sources = json::array();
  size_t due = 0;
  for (const auto& o : report.sources) {
    due += o.due.due ? 1 : 0;
    sources.push_back(SourceJson(policy, o));
  }
  return {{"policy", policy.name},
          {"run_id", report.run_id},
          {"shard", ShardJson(report.shard)},
          {"started_at", orc::FormatRfc3339(report.started_at)},
          {"finished_at", orc::FormatRfc3339(report.started_at + std::chrono::seconds(static_cast<int64_t>(
                                                                      report.duration_seconds + 0.5)))},
          {"duration_seconds", report.duration_seconds},
          {"due", due},
          {"ran", report.ran},
          {"succeeded", report.ran - report.failed},
          {"failed", report.failed},
          {"stopped", report.stopped},
          {"stop_reason", report.stop_reason},
          {"sources", sources}};
}

std::string SignalStopReason() {
  return InterruptSignal() == SIGINT ? "stopped by SIGINT" : "stopped by SIGTERM";
}

}  // namespace barge::cli
