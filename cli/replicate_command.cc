// barge replicate: one source (raw/qcow2 file, block device, NBD URI) read
// once into several files, each checked by SHA-512 and recorded beside it.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <mutex>

#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/progress.h"
#include "pipeline/endpoints.h"
#include "pipeline/replicate.h"

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
  double stall_timeout_s = 60;
  bool verify = false;
  bool force = false;
  bool as_json = false;
};

// One line per destination: redrawn in place on a terminal (cursor up),
// JSON lines with --json. Thread-safe: destinations report from their own
// serial nodes.
class MultiProgress {
 public:
  MultiProgress(ProgressMode mode, const std::vector<std::string>& names)
      : mode_(mode), names_(names), done_(names.size(), 0), total_(names.size(), 0),
        last_json_(names.size()) {}

  void Update(size_t i, uint64_t done, uint64_t total) {
    if (mode_ == ProgressMode::kNone || i >= names_.size()) return;
    std::lock_guard lock(mu_);
    done_[i] = done;
    total_[i] = total;
    auto now = std::chrono::steady_clock::now();
    if (mode_ == ProgressMode::kJsonLines) {
      if (done < total && now - last_json_[i] < std::chrono::seconds(1)) return;
      last_json_[i] = now;
      json j = {{"event", "progress"}, {"job", "replicate"}, {"destination", names_[i]},
                {"done_bytes", done}, {"total_bytes", total},
                {"percent", total ? static_cast<int>(1000.0 * done / total) / 10.0 : 100.0}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
      return;
    }
    if (done < total && now - last_draw_ < std::chrono::milliseconds(200)) return;
    last_draw_ = now;
    Draw();
  }

  void Done() {
    std::lock_guard lock(mu_);
    if (mode_ == ProgressMode::kBar && drawn_) Draw();
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

  ProgressMode mode_;
  std::vector<std::string> names_;
  std::mutex mu_;
  std::vector<uint64_t> done_, total_;
  std::vector<std::chrono::steady_clock::time_point> last_json_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

int RunReplicateCommand(ReplicateArgs& a) {
  pipeline::ReplicateOptions o;
  CompressionChoice compression;
  if (Status s = a.copy.Apply(o.copy, compression); !s.ok()) return ReportError(s.error());
  auto format = pipeline::ParseReplicaFormat(a.format);
  if (!format.ok()) return ReportError(format.error());
  auto backing = pipeline::ParseBackingPolicy(a.backing);
  if (!backing.ok()) return ReportError(backing.error());
  if (a.stall_timeout_s < 0) return ReportError(Error::InvalidArgument("--stall-timeout must be >= 0"));
  o.format = *format;
  o.backing = *backing;
  o.expected_sha512 = a.expected_sha512;
  o.verify = a.verify;
  o.force = a.force;
  o.copy.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.stall_timeout_s * 1000));
  // A kept backing chain is opened (for --verify) under the same policy.
  o.allow_any_path = a.flags.allow_any_path;
  o.allow_dirs = a.flags.allow_dirs;

  pipeline::SourceSpec spec;
  spec.location = a.source;
  spec.format = a.flags.format;
  spec.allow_any_path = a.flags.allow_any_path;
  spec.allow_dirs = a.flags.allow_dirs;
  auto src = pipeline::OpenSource(spec);
  if (!src.ok()) return ReportError("replicate", src.error());
  o.source_location = a.source;
  o.source_format = src->format_name();

  MultiProgress progress(ChooseProgressMode(a.as_json), a.to);
  o.progress = [&](size_t i, uint64_t done, uint64_t total) { progress.Update(i, done, total); };
  auto result = pipeline::RunReplicate(*src->image, a.to, o);
  progress.Done();
  if (!result.ok()) return ReportError("replicate", result.error());
  const auto& r = *result;
  double secs = std::chrono::duration<double>(r.elapsed).count();

  if (r.checksum_mismatch) {
    std::cerr << "barge: replicate: checksum mismatch, nothing made ready\n"
              << "  expected sha512: " << a.expected_sha512 << "\n"
              << "  source   sha512: " << r.sha512_hex << "\n";
  }
  if (a.as_json) {
    json dests = json::array();
    for (const auto& d : r.replicas) {
      json j = {{"path", d.path}, {"state", pipeline::ReplicaStateName(d.state)}, {"verified", d.verified}};
      if (d.error) j["error"] = d.error->ToString();
      if (d.state != pipeline::ReplicaState::kFailed) j["file_bytes"] = d.file_bytes;
      dests.push_back(std::move(j));
    }
    PrintJson({{"event", "result"},
               {"source", a.source},
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
               {"seconds", secs},
               {"destinations", dests}});
  } else {
    for (const auto& d : r.replicas) {
      std::cout << pipeline::ReplicaStateName(d.state) << " " << d.path;
      if (d.verified) std::cout << " (verified)";
      if (d.error) std::cout << ": " << d.error->ToString();
      std::cout << "\n";
    }
    std::cout << "sha512 " << r.sha512_hex << "\n"
              << HumanBytes(r.virtual_size) << " virtual, " << r.format << ", read "
              << HumanBytes(r.bytes_read) << " in " << secs << " s";
    if (!r.bitmaps.empty()) std::cout << ", " << r.bitmaps.size() << " bitmap(s) carried";
    if (r.bitmaps_dropped) std::cout << ", bitmaps dropped (raw output)";
    if (!r.backing_file.empty()) std::cout << ", top layer only, backing file '" << r.backing_file << "'";
    std::cout << "\n";
  }
  return r.all_ok() ? kExitOk : kExitError;
}

}  // namespace

void RegisterReplicateCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ReplicateArgs>();
  auto* cmd = app.add_subcommand(
      "replicate", "Copy one image to several files in one read pass, SHA-512 checked and recorded");
  cmd->add_option("source", args->source, "Source: raw/qcow2 file, block device or nbd:// URI")->required();
  cmd->add_option("--to", args->to, "Destination file (repeatable)")->required();
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
  cmd->add_option("--stall-timeout", args->stall_timeout_s,
                  "Seconds without progress after which a destination fails (0 = never)")
      ->capture_default_str();
  args->flags.AddTo(cmd, "--source-format");
  args->copy.AddTo(cmd, "none");
  cmd->add_flag("--json", args->as_json, "Progress as JSON lines, then one result object");
  cmd->callback([args, &exit_code]() { exit_code = RunReplicateCommand(*args); });
}

}  // namespace barge::cli
