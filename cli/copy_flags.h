// Flags shared by every command that runs the copy pipeline (convert,
// backup, restore, replicate): compression, cluster size, threads, memory.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "blockio/error.h"
#include "formats/image.h"
#include "pipeline/copy.h"

namespace barge::cli {

struct CompressionChoice {
  formats::Compression type = formats::Compression::kNone;
  int level = 0;
  std::string ToString() const;  // "zstd:3", "zlib:6", "none"
};

// "zstd", "zstd:N" (1..19), "deflate"/"zlib"[:N] (1..9), "none".
Result<CompressionChoice> ParseCompression(const std::string& text);

// What backups compress with unless told: "zstd:" + formats::kDefaultZstdLevel.
std::string DefaultCompression();

struct CopyFlags {
  std::string compress;
  std::string cluster_size = "64K";
  std::string memory = "256M";
  int threads = 0;

  // `default_compress` is shown in --help and used when the flag is absent.
  void AddTo(CLI::App* app, const std::string& default_compress);
  // Fills cluster size, memory, threads, compression of `options`, and
  // points its cancel flag at SIGINT/SIGTERM's (cli/interrupt.h).
  // kInvalidArgument naming the flag and its allowed range otherwise.
  Status Apply(pipeline::CopyOptions& options, CompressionChoice& compression) const;
};

// --memory and --threads alone (commands whose cluster size and
// compression come from elsewhere, e.g. merge), checked against their
// ranges; also points options.cancel at SIGINT/SIGTERM's flag.
Status ApplyResourceFlags(const std::string& memory, int threads, pipeline::CopyOptions& options);

// log2 of a power-of-two cluster size in 512..2M, else kInvalidArgument.
Result<uint32_t> ClusterBits(uint64_t cluster_bytes);

}  // namespace barge::cli
