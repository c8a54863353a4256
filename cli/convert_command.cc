// barge convert: copy any image (raw/qcow2 chain/device/NBD) into a raw or
// qcow2 file or a block device, through the copy pipeline.
#include <optional>
#include <iostream>

#include "blockio/env.h"
#include "blockio/path.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/progress.h"
#include "pipeline/endpoints.h"
#include "pipeline/overlay_destination.h"
#include "pipeline/staged_file.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct ConvertArgs {
  std::string source, dest, output_format = "raw";
  ImageFlags flags;
  CopyFlags copy;
  std::string backing, backing_format;
  std::string snapshot;
  bool force = false;
  bool no_sync = false;
};

// Where the output goes: a staged file (renamed when complete) or a block
// device written in place.
struct OutputTarget {
  std::unique_ptr<pipeline::StagedFile> staged;
  std::unique_ptr<BlockSink> device;
  BlockSink& sink() { return staged ? staged->sink() : *device; }
  Status Commit() { return staged ? staged->Commit() : device->Flush(); }
};

Result<OutputTarget> OpenOutput(const std::string& path, bool force, bool sync, uint64_t needed_size) {
  OutputTarget out;
  Env& env = Env::Default();
  auto st = env.Stat(path);
  if (st.ok() && st->is_block_device()) {
    FileOptions options;
    options.sync = sync;
    BARGE_ASSIGN_OR_RETURN(out.device, env.OpenSink(path, SinkMode::kExisting, options));
    if (out.device->size_bytes() < needed_size) {
      return Error::NoSpace("device is smaller than the image (" +
                            HumanBytesExact(out.device->size_bytes()) + " < " +
                            HumanBytesExact(needed_size) + ")")
          .set_path(path);
    }
    return out;
  }
  // Not a place for a file at all (/dev/null, a folder): said as such, not
  // as "use --force".
  BARGE_RETURN_IF_ERROR(pipeline::CheckOutputPath(env, path));
  // Leftovers of killed runs in the output's folder go first (a live
  // writer's temporary is locked and kept).
  IgnoreError(SweepStaleTemporaries(env, DirName(path)),
              "a leftover that cannot be removed now is swept by a later run");
  auto staged = pipeline::StagedFile::Create(env, path, force, sync);
  if (!staged.ok()) {
    Error e = std::move(staged).error();
    if (e.code() == ErrorCode::kInvalidArgument) e.Wrap("use --force to replace it");
    return e;
  }
  out.staged = std::move(staged).value();
  return out;
}

int RunConvert(ConvertArgs& a, Output& cli_out) {
  pipeline::CopyOptions options;
  formats::CompressionSpec compression;
  if (Status s = a.copy.Apply(options, compression); !s.ok()) return cli_out.Usage(s.error().message());
  bool qcow2 = a.output_format == "qcow2";
  if (!qcow2 && compression.type != formats::Compression::kNone) return cli_out.Usage("--compress needs -O qcow2");
  if (!a.backing.empty() && !qcow2) return cli_out.Usage("--backing needs -O qcow2");
  if (!a.backing_format.empty() && a.backing.empty()) return cli_out.Usage("--backing-format needs --backing");
  if (!qcow2 && a.copy.cluster_size_given()) {
    return cli_out.Usage("--cluster-size needs -O qcow2 (a raw output has no clusters)");
  }
  WarnIfMisnamed(cli_out, a.source, a.flags.format);

  pipeline::SourceSpec spec;
  spec.location = a.source;
  spec.format = a.flags.format;
  spec.allow_any_path = a.flags.allow_any_path;
  spec.allow_dirs = a.flags.allow_dirs;
  spec.snapshot = a.snapshot;
  auto src = pipeline::OpenSource(Env::Default(), spec);
  if (!src.ok()) return cli_out.Fail(src.error());
  formats::Image& image = *src->image;
  uint64_t size = image.size_bytes();

  auto out = OpenOutput(a.dest, a.force, !a.no_sync, size);
  if (!out.ok()) return cli_out.Fail(out.error());
  bool device = out->device != nullptr;
  if (qcow2 && device) {
    return cli_out.Fail(Error::NotSupported("qcow2 output goes to a file, not a block device").set_path(a.dest));
  }

  // The backing image, opened to compare against: the output stores only
  // the clusters that read differently (as qemu-img convert -B does).
  std::optional<pipeline::OpenedSource> backing;
  if (!a.backing.empty()) {
    pipeline::SourceSpec bspec;
    bspec.location = LexicallyNormal(JoinPath(DirName(a.dest), a.backing));
    bspec.format = a.backing_format.empty() ? "qcow2" : a.backing_format;
    bspec.allow_any_path = a.flags.allow_any_path;
    bspec.allow_dirs = a.flags.allow_dirs;
    auto opened = pipeline::OpenSource(Env::Default(), bspec);
    if (!opened.ok()) {
      return cli_out.Fail(Error(opened.error())
                              .Wrap("cannot open the backing file '" + a.backing +
                                    "' (named relative to the output; convert stores only what differs from it)"));
    }
    backing = std::move(opened).value();
  }

  std::unique_ptr<pipeline::Destination> dest;
  if (qcow2) {
    formats::Qcow2WriterOptions w;
    w.virtual_size = size;
    w.cluster_bits = *ClusterBits(options.cluster_bytes);
    w.compression = compression.type;
    if (backing) {
      w.backing_file = a.backing;
      w.backing_format = a.backing_format.empty() ? "qcow2" : a.backing_format;
      auto d = pipeline::OverlayQcow2Destination::CreateDiff(out->sink(), w, *backing->image);
      if (!d.ok()) return cli_out.Fail(d.error());
      dest = std::move(d).value();
    } else {
      auto d = pipeline::Qcow2Destination::Create(out->sink(), w, pipeline::ZeroPolicy::kOmit);
      if (!d.ok()) return cli_out.Fail(d.error());
      dest = std::move(d).value();
    }
  } else {
    pipeline::RawDestinationOptions r;
    r.virtual_size = size;
    // An existing device may hold old data: zero ranges must be written.
    r.skip_zeroes_if_zero_initialized = !device;
    dest = std::make_unique<pipeline::RawDestination>(out->sink(), r);
  }

  ProgressReporter progress(cli_out, "convert");
  options.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  pipeline::Destination* dests[] = {dest.get()};
  auto result = pipeline::RunCopy(image, pipeline::WholeDisk(image), dests, options);
  progress.Done();
  if (!result.ok()) return cli_out.Fail(result.error());
  if (Status s = out->Commit(); !s.ok()) return cli_out.Fail(s.error());

  double secs = std::chrono::duration<double>(result->elapsed).count();
  uint64_t written = 0;
  if (!device) {
    if (auto st = Env::Default().Stat(a.dest); st.ok()) written = st->size_bytes;
  }
  {
    json j = {{"source", a.source},
               {"destination", a.dest},
               {"format", a.output_format},
               {"compression", compression.ToString()},
               {"virtual_size", size},
               {"bytes_read", result->bytes_read},
               {"bytes_written", written},
               {"clusters",
                {{"data", result->clusters.data},
                 {"compressed", result->clusters.compressed},
                 {"zero", result->clusters.zero},
                 {"hole", result->clusters.hole}}},
               {"image_digest", "xxh3-128:" + result->image_digest.ToHex()},
               {"duration_seconds", secs}};
    if (!a.snapshot.empty()) j["snapshot"] = a.snapshot;
    cli_out.Result(j);
  }
  cli_out.text() << "converted " << a.source << (a.snapshot.empty() ? "" : " at snapshot '" + a.snapshot + "'")
                 << " -> " << a.dest << " (" << a.output_format << ", " << compression.ToString()
                 << "): " << HumanBytes(size) << " virtual, read " << HumanBytes(result->bytes_read) << ", wrote "
                 << HumanBytes(written) << " in " << HumanSeconds(secs) << ", image digest xxh3-128:"
                 << result->image_digest.ToHex() << "\n";
  return kExitOk;
}

}  // namespace

void RegisterConvertCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  auto* cmd = AddCommand(
      app, "convert", "Copy an image (raw, qcow2 chain, block device, NBD URI) to raw or qcow2", exit_code,
      [args](Output& out) { return RunConvert(*args, out); });
  cmd->add_option("source", args->source, "Source image, block device or nbd:// URI")->required();
  cmd->add_option("dest", args->dest, "Destination file or block device")->required();
  cmd->add_option("-O,--output-format", args->output_format, "raw or qcow2")
      ->check(CLI::IsMember({"raw", "qcow2"}))
      ->capture_default_str();
  args->flags.AddTo(cmd);
  cmd->add_option("-l,--snapshot", args->snapshot,
                  "Read the qcow2 source at this internal snapshot (id or name), as qemu-img convert -l does");
  args->copy.AddTo(cmd, "none");
  cmd->add_option("--backing", args->backing,
                  "qcow2 output: backing file to store by this name (relative to the output); "
                  "only clusters that differ from it are written");
  cmd->add_option("--backing-format", args->backing_format, "Format of the backing file (default qcow2)")
      ->check(CLI::IsMember({"raw", "qcow2"}));
  cmd->add_flag("--force", args->force, "Replace an existing output file");
  cmd->add_flag("--no-sync", args->no_sync,
                "Do not fsync the output at the end (faster; a crash may lose it, as with qemu-img convert)");
}

}  // namespace barge::cli
