// barge replicate: one source (raw/qcow2 file, block device, NBD URI) read
// once into several files, each checked by SHA-512 and recorded beside it.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <mutex>

#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/http_flags.h"
#include "cli/nbd_flags.h"
#include "cli/interrupt.h"
#include "cli/progress.h"
#include "orchestrate/catalog/catalog_path.h"
#include "pipeline/endpoints.h"
#include "pipeline/replicate.h"
#include "pipeline/replicate_outcome.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct ReplicateArgs {
  std::string source;
  std::vector<std::string> to;
  std::string expected_sha512;
  std::string format = "keep";
  std::string backing = "flatten";
  ImageFlags flags;
  CopyFlags copy;
  NbdFlags nbd;
  HttpFlags http;
  double stall_timeout_s = 60;
  bool verify = false;
  bool force = false;
  bool no_resume = false;
  std::string state_dir;
};


// One line per destination: redrawn in place on a terminal (cursor up),
// JSON lines with --json. Thread-safe: destinations report from their own
// serial nodes.
class MultiProgress {
 public:
  MultiProgress(Output& out, const std::vector<std::string>& names)
      : out_(out), mode_(out.json() ? Mode::kEvents : ::isatty(STDERR_FILENO) ? Mode::kBar : Mode::kNone),
        names_(names), done_(names.size(), 0), total_(names.size(), 0), last_json_(names.size()),
        start_(std::chrono::steady_clock::now()) {}

  void Update(size_t i, uint64_t done, uint64_t total) {
    if (mode_ == Mode::kNone || i >= names_.size()) return;
    std::lock_guard lock(mu_);
    done_[i] = done;
    total_[i] = total;
    auto now = std::chrono::steady_clock::now();
    if (mode_ == Mode::kEvents) {
      if (done < total && now - last_json_[i] < std::chrono::seconds(1)) return;
      last_json_[i] = now;
      double secs = std::chrono::duration<double>(now - start_).count();
      out_.Progress({{"job", "replicate"}, {"destination", names_[i]},
                     {"done_bytes", done}, {"total_bytes", total},
                     {"percent", total ? static_cast<int>(1000.0 * done / total) / 10.0 : 100.0},
                     {"bytes_per_second", secs > 0 ? static_cast<uint64_t>(static_cast<double>(done) / secs) : 0},
                     {"elapsed_seconds", secs}});
      return;
    }
    if (done < total && now - last_draw_ < std::chrono::milliseconds(200)) return;
    last_draw_ = now;
    Draw();
  }

  void Done() {
    std::lock_guard lock(mu_);
    if (mode_ == Mode::kBar && drawn_) Draw();
  }

 private:
  void Draw() {
    if (drawn_) std::fprintf(stderr, "\033[%zuA", names_.size());
    for (size_t i = 0; i < names_.size(); ++i) {
      double pct = total_[i] ? 100.0 * static_cast<double>(done_[i]) / static_cast<double>(total_[i]) : 0;
      std::fprintf(stderr, "\r\033[K%5.1f%% %s\n", pct, names_[i].c_str());
    }
    drawn_ = true;
  }

  enum class Mode : uint8_t { kNone, kBar, kEvents };
  Output& out_;
  Mode mode_;
  std::vector<std::string> names_;
  std::mutex mu_;
  std::vector<uint64_t> done_, total_;
  std::vector<std::chrono::steady_clock::time_point> last_json_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

int RunReplicateCommand(ReplicateArgs& a, Output& out) {
  pipeline::ReplicateOptions o;
  formats::CompressionSpec compression;
  if (Status s = a.copy.Apply(o.copy, compression, &out); !s.ok()) return out.Usage(s.error().message());
  auto format = pipeline::ParseReplicaFormat(a.format);
  if (!format.ok()) return out.Usage(format.error().message());
  auto backing = pipeline::ParseBackingPolicy(a.backing);
  if (!backing.ok()) return out.Usage(backing.error().message());
  if (a.stall_timeout_s < 0) return out.Usage("--stall-timeout must be >= 0");
  o.format = *format;
  o.backing = *backing;
  o.expected_sha512 = a.expected_sha512;
  o.verify = a.verify;
  o.force = a.force;
  o.resume = !a.no_resume;
  o.nbd = a.nbd.access;
  o.state_dir = a.state_dir.empty() ? orchestrate::BargeStateDir() + "/replicate" : a.state_dir;
  // Said before the copy starts, so a long resumed run shows it at once.
  o.on_resume = [&out](const pipeline::ResumeNote& note) {
    if (note.resumed) {
      out.text() << "resuming from " << HumanBytes(note.staged_bytes) << " written (of "
                 << HumanBytes(note.total_bytes) << ")"
                 << (note.problem.empty() ? "" : "; copied again from " + note.problem) << "\n";
    } else {
      out.text() << "staged copy not reusable: " << note.problem << ", starting over\n";
    }
    out.text().flush();
  };
  o.copy.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.stall_timeout_s * 1000));
  // A kept backing chain is opened (for --verify) under the same policy.
  o.allow_any_path = a.flags.allow_any_path;
  o.allow_dirs = a.flags.allow_dirs;

  pipeline::SourceSpec spec;
  spec.location = a.source;
  spec.format = a.flags.format;
  spec.allow_any_path = a.flags.allow_any_path;
  spec.allow_dirs = a.flags.allow_dirs;
  spec.nbd_retry = o.copy.nbd_retry;
  spec.nbd = a.nbd.access;
  auto http = a.http.OptionsFor(out, a.source);
  if (!http.ok()) return out.Usage(http.error().message());
  spec.http = std::move(http).value();
  WarnIfMisnamed(out, a.source, a.flags.format);
  auto src = pipeline::OpenSource(Env::Default(), spec);
  if (!src.ok()) return out.Fail(src.error());
  o.source_location = a.source;
  o.source_format = src->format_name();
  // A staged copy of a download resumes only from the same version.
  if (!src->remote_version.empty()) o.resume_identity = src->remote_version;
  if (Status s = pipeline::CheckQcow2Shaping(o.format, a.format, src->format_name(), a.copy.compress_given(),
                                             a.copy.cluster_size_given());
      !s.ok()) {
    return out.Usage(s.error().message());
  }

  std::vector<std::string> shown;  // NBD targets without their secrets
  for (const std::string& d : a.to) shown.push_back(RedactNbdUri(d));
  MultiProgress progress(out, shown);
  o.progress = [&](size_t i, uint64_t done, uint64_t total) { progress.Update(i, done, total); };
  auto result = pipeline::RunReplicate(Env::Default(), *src->image, a.to, o);
  progress.Done();
  if (!result.ok()) return out.Fail(result.error());
  const auto& r = *result;
  double secs = std::chrono::duration<double>(r.elapsed).count();

  {
    json dests = json::array();
    for (const auto& d : r.replicas) {
      json j = {{"path", d.path}, {"state", pipeline::ReplicaStateName(d.state)}, {"verified", d.verified}};
      if (d.error) {
        // As the error event's fields (docs/json.md).
        json e = {{"code", ErrorCodeName(d.error->code())}, {"message", d.error->message()},
                  {"retryable", d.error->retryable()}};
        if (!d.error->path().empty()) e["file"] = d.error->path();
        if (d.error->offset()) e["offset"] = *d.error->offset();
        if (d.error->errno_value() != 0) e["errno"] = d.error->errno_value();
        j["error"] = std::move(e);
      }
      if (d.state != pipeline::ReplicaState::kFailed) j["file_bytes"] = d.file_bytes;
      dests.push_back(std::move(j));
    }
    json result = {{"source", RedactNbdUri(a.source)},
               {"source_format", o.source_format},
               {"format", r.format},
               {"virtual_size", r.virtual_size},
               {"sha512", r.sha512_hex},
               {"expected_sha512", a.expected_sha512},
               {"checksum_mismatch", r.checksum_mismatch},
               {"bitmaps", r.bitmaps},
               {"bitmaps_dropped", r.bitmaps_dropped},
               {"backing", a.backing},
               {"backing_file", r.backing_file},
               {"bytes_read", r.bytes_read},
               {"duration_seconds", secs},
               {"destinations", dests}};
    if (r.resume) {
      result["resume"] = {{"resumed", r.resume->resumed},
                          {"staged_bytes", r.resume->staged_bytes},
                          {"problem", r.resume->problem}};
    }
    out.Result(result);
  }
  std::ostream& t = out.text();
  for (const auto& d : r.replicas) {
    t << pipeline::ReplicaStateName(d.state) << " " << d.path;
    if (d.verified) t << " (verified)";
    if (d.error) t << ": " << d.error->ToString();
    t << "\n";
  }
  t << "sha512 " << r.sha512_hex << "\n"
    << HumanBytes(r.virtual_size) << " virtual, " << r.format;
  // A pass that failed counts no bytes: say it failed, not "read 0 B".
  const bool all_failed = std::all_of(r.replicas.begin(), r.replicas.end(), [](const auto& d) {
    return d.state == pipeline::ReplicaState::kFailed;
  });
  if (all_failed && r.bytes_read == 0) {
    t << ", failed after " << HumanSeconds(secs);
  } else {
    t << ", read " << HumanBytes(r.bytes_read) << " in " << HumanSeconds(secs);
  }
  if (!r.bitmaps.empty()) t << ", " << r.bitmaps.size() << " bitmap(s) carried";
  if (r.bitmaps_dropped) t << ", bitmaps dropped (raw output)";
  if (!r.backing_file.empty()) t << ", top layer only, backing file '" << r.backing_file << "'";
  if (r.resume && r.resume->resumed) t << " (resumed: " << HumanBytes(r.resume->staged_bytes) << " already written)";
  t << "\n";
  if (CancelFlag().load()) return out.Fail(Error::Cancelled("replicate interrupted").set_path(RedactNbdUri(a.source)));
  if (Status s = pipeline::ReplicateOutcome(r, a.expected_sha512, RedactNbdUri(a.source)); !s.ok()) {
    return out.Fail(s.error());
  }
  return kExitOk;
}

}  // namespace

void RegisterReplicateCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ReplicateArgs>();
  auto* cmd = AddCommand(
      app, "replicate", "Copy one image to several files in one read pass, SHA-512 checked and recorded",
      exit_code, [args](Output& out) { return RunReplicateCommand(*args, out); });
  cmd->add_option("source", args->source, "Source: raw/qcow2 file, block device, nbd:// URI or http(s):// URL")->required();
  cmd->add_option("--to", args->to,
                  "Destination file, or nbd:// / nbds:// / nbd+unix:// export written in place, raw (repeatable)")
      ->required();
  cmd->add_option("--expected-sha512", args->expected_sha512,
                  "SHA-512 of the logical content; on mismatch nothing is made ready");
  cmd->add_option("--format", args->format, "Output format: keep (qcow2 stays qcow2), raw or qcow2")
      ->check(CLI::IsMember({"keep", "raw", "qcow2"}))
      ->capture_default_str();
  cmd->add_option("--backing", args->backing,
                  "qcow2 source with a backing file: flatten (each copy holds the whole guest view, "
                  "no backing file) or keep (qcow2 copies of the top layer only, naming the same "
                  "backing file as the source, resolved beside each copy: deliver the base there "
                  "first, --verify needs it); the SHA-512 is of the guest view either way")
      ->check(CLI::IsMember({"flatten", "keep"}))
      ->capture_default_str();
  cmd->add_flag("--verify", args->verify, "Re-read each new copy and compare its digests");
  cmd->add_flag("--force", args->force, "Replace existing files that are not matching copies");
  cmd->add_flag("--no-resume", args->no_resume,
                "Do not resume what an interrupted run of this replicate wrote: sweep it and start over (and "
                "keep nothing for a later run if this one fails)");
  cmd->add_option("--stall-timeout", args->stall_timeout_s,
                  "Seconds without progress after which a destination fails (0 = never)")
      ->capture_default_str();
  args->flags.AddTo(cmd, "--source-format");
  args->copy.AddTo(cmd, "none", kAllCopyFlags | kNbdFlags);
  cmd->add_option("--state-dir", args->state_dir,
                  "Where NBD targets' checksum records and resume journals are kept (default: "
                  "$XDG_STATE_HOME/barge/replicate)")
      ->type_name("DIR");
  args->nbd.AddTo(cmd, "an nbd:// or nbds:// source and NBD targets");
  args->http.AddTo(cmd);
}

}  // namespace barge::cli
