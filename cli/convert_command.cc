// barge convert: flags in, pipeline::RunConvert (pipeline/convert.h), the
// result printed.
#include "blockio/env.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/group_flag.h"
#include "cli/http_flags.h"
#include "cli/nbd_flags.h"
#include "cli/progress.h"
#include "pipeline/convert.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct ConvertArgs {
  std::string source, dest, output_format = "raw";
  ImageFlags flags;
  CopyFlags copy;
  NbdFlags nbd;
  HttpFlags http;
  std::string backing, backing_format;
  std::string snapshot;
  bool force = false;
  bool no_sync = false;
  std::string group;  // --group
};

int RunConvert(ConvertArgs& a, Output& cli_out) {
  pipeline::ConvertRequest req;
  formats::CompressionSpec compression;
  if (Status s = a.copy.Apply(req.copy, compression, &cli_out); !s.ok()) return cli_out.Usage(s.error().message());
  bool qcow2 = a.output_format == "qcow2";
  const auto format = qcow2 ? pipeline::DestinationFormat::kQcow2 : pipeline::DestinationFormat::kRaw;
  const bool compressed = compression.type != formats::Compression::kNone;
  Status shape = pipeline::CheckConvertOptions(format, compressed, !a.backing.empty(), !a.backing_format.empty(),
                                               a.copy.cluster_size_given());
  if (!shape.ok()) return cli_out.Usage(shape.error().message());
  WarnIfMisnamed(cli_out, a.source, a.flags.format);

  req.source.location = a.source;
  req.source.format = a.flags.format;
  req.source.allow_any_path = a.flags.allow_any_path;
  req.source.allow_dirs = a.flags.allow_dirs;
  req.source.snapshot = a.snapshot;
  req.source.nbd = a.nbd.access;
  auto http = a.http.OptionsFor(cli_out, a.source);
  if (!http.ok()) return cli_out.Usage(http.error().message());
  req.source.http = std::move(http).value();
  req.destination = a.dest;
  req.format = format;
  req.backing = a.backing;
  req.backing_format = a.backing_format;
  req.force = a.force;
  auto access = GroupFlagAccess(a.group);
  if (!access.ok()) return cli_out.Usage(access.error().message());
  if (*access) req.access = **access;
  req.sync = !a.no_sync;
  ProgressReporter progress(cli_out, "convert");
  req.copy.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  auto result = pipeline::RunConvert(Env::Default(), req);
  progress.Done();
  if (!result.ok()) return cli_out.Fail(result.error());

  {
    json j = {{"source", RedactNbdUri(a.source)},
               {"destination", a.dest},
               {"format", a.output_format},
               {"compression", compression.ToString()},
               {"virtual_size", result->virtual_size},
               {"bytes_read", result->bytes_read},
               {"bytes_written", result->bytes_written},
               {"clusters",
                {{"data", result->clusters.data},
                 {"compressed", result->clusters.compressed},
                 {"zero", result->clusters.zero},
                 {"hole", result->clusters.hole}}},
               {"image_digest", "xxh3-128:" + result->image_digest.ToHex()},
               {"duration_seconds", result->seconds}};
    if (!a.snapshot.empty()) j["snapshot"] = a.snapshot;
    cli_out.Result(j);
  }
  cli_out.text() << "converted " << RedactNbdUri(a.source) << (a.snapshot.empty() ? "" : " at snapshot '" + a.snapshot + "'")
                 << " -> " << a.dest << " (" << a.output_format << ", " << compression.ToString()
                 << "): " << HumanBytes(result->virtual_size) << " virtual, read " << HumanBytes(result->bytes_read)
                 << ", wrote " << HumanBytes(result->bytes_written) << " in " << HumanSeconds(result->seconds)
                 << ", image digest xxh3-128:" << result->image_digest.ToHex() << "\n";
  return kExitOk;
}

}  // namespace

void RegisterConvertCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  auto* cmd = AddCommand(
      app, "convert", "Copy an image (raw, qcow2 chain, block device, NBD URI) to raw or qcow2", exit_code,
      [args](Output& out) { return RunConvert(*args, out); });
  cmd->add_option("source", args->source, "Source image, block device, nbd:// URI or http(s):// URL")->required();
  cmd->add_option("dest", args->dest, "Destination file or block device")->required();
  cmd->add_option("-O,--output-format", args->output_format, "raw or qcow2")
      ->check(CLI::IsMember({"raw", "qcow2"}))
      ->capture_default_str();
  args->flags.AddTo(cmd);
  cmd->add_option("-l,--snapshot", args->snapshot,
                  "Read the qcow2 source at this internal snapshot (id or name), as qemu-img convert -l does");
  args->copy.AddTo(cmd, "none", kAllCopyFlags | kNbdFlags);
  args->nbd.AddTo(cmd, "an nbd:// or nbds:// source");
  args->http.AddTo(cmd);
  cmd->add_option("--backing", args->backing,
                  "qcow2 output: backing file to store by this name (relative to the output); "
                  "only clusters that differ from it are written");
  cmd->add_option("--backing-format", args->backing_format, "Format of the backing file (default qcow2)")
      ->check(CLI::IsMember({"raw", "qcow2"}));
  cmd->add_flag("--force", args->force, "Replace an existing output file");
  AddGroupFlag(cmd, args->group, "an output file made anew (a file replaced keeps its mode)");
  cmd->add_flag("--no-sync", args->no_sync,
                "Do not fsync the output at the end (faster; a crash may lose it, as with qemu-img convert)");
}

}  // namespace barge::cli
