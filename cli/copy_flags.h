// Flags shared by every command that runs the copy pipeline (convert,
// backup, restore, replicate): compression, cluster size, threads, memory,
// and how an NBD source or output reconnects after a drop.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "blockio/error.h"
#include "cli/output.h"
#include "formats/image.h"
#include "pipeline/copy.h"

namespace barge::cli {

// What backups compress with unless told: formats::CompressionSpec::Default(),
// printed ("zstd:1"). --compress is parsed by formats::ParseCompressionSpec.
std::string DefaultCompression();

// Which of the copy flags a command takes (a bit set).
enum CopyFlagSet : unsigned {
  kCompressFlag = 1u << 0,     // --compress
  kClusterSizeFlag = 1u << 1,  // --cluster-size
  kResourceFlags = 1u << 2,    // --memory, --threads
  kAllCopyFlags = kCompressFlag | kClusterSizeFlag | kResourceFlags,
  // --nbd-retries, --nbd-retry-time, --nbd-timeout: only for commands that
  // read or write NBD (registered only when asked for).
  kNbdFlags = 1u << 3,
};

struct CopyFlags {
  std::string compress;
  std::string cluster_size = "64K";
  std::string memory = "256M";
  int threads = 0;
  int nbd_retries = 5;
  double nbd_retry_time_s = 60;
  double nbd_timeout_s = 30;

  // Registers the flags in `which` (`default_compress` is shown in --help
  // and used when --compress is absent). The others are registered hidden,
  // so that giving one is refused by Apply with `why_not` ("verify only
  // reads") instead of being ignored or called unknown.
  void AddTo(CLI::App* app, const std::string& default_compress, unsigned which = kAllCopyFlags,
             std::string why_not = "");
  // Whether the user gave the flag (not its default).
  bool compress_given() const;
  bool cluster_size_given() const;
  // Fills cluster size, memory, threads, compression of `options`, and
  // points its cancel flag at SIGINT/SIGTERM's (cli/interrupt.h). With
  // kNbdFlags, also options.nbd_retry, whose reconnects are reported to
  // `out` (a stderr line and a "reconnect" event) when it is given; `out`
  // must outlive the job.
  // kInvalidArgument naming the flag and its allowed range, or a flag the
  // command does not take and why.
  Status Apply(pipeline::CopyOptions& options, formats::CompressionSpec& compression,
               Output* out = nullptr) const;

 private:
  std::string command_;
  unsigned which_ = kAllCopyFlags;
  std::string why_not_;
  CLI::Option* compress_option_ = nullptr;
  CLI::Option* cluster_size_option_ = nullptr;
  CLI::Option* memory_option_ = nullptr;
  CLI::Option* threads_option_ = nullptr;
};

// --memory and --threads alone (commands whose cluster size and
// compression come from elsewhere, e.g. merge), checked against their
// ranges; also points options.cancel at SIGINT/SIGTERM's flag.
Status ApplyResourceFlags(const std::string& memory, int threads, pipeline::CopyOptions& options);

}  // namespace barge::cli
