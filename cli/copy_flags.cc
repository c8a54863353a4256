// Parsing of the copy pipeline's flags.
#include "cli/copy_flags.h"

#include "cli/common.h"

namespace barge::cli {

std::string CompressionChoice::ToString() const {
  if (type == formats::Compression::kNone) return "none";
  return std::string(formats::CompressionName(type)) + ":" + std::to_string(level);
}

Result<CompressionChoice> ParseCompression(const std::string& text) {
  std::string name = text, level_text;
  if (auto colon = text.find(':'); colon != std::string::npos) {
    name = text.substr(0, colon);
    level_text = text.substr(colon + 1);
  }
  CompressionChoice c;
  int max_level = 0;
  if (name == "none") {
    if (!level_text.empty()) return Error::InvalidArgument("'none' takes no level");
    return c;
  } else if (name == "zstd") {
    c = {formats::Compression::kZstd, formats::kDefaultZstdLevel};
    max_level = 19;
  } else if (name == "deflate" || name == "zlib") {
    c = {formats::Compression::kDeflate, formats::kDefaultDeflateLevel};
    max_level = 9;
  } else {
    return Error::InvalidArgument("unknown compression '" + text +
                                  "' (use zstd[:1-19], deflate[:1-9] or none)");
  }
  if (!level_text.empty()) {
    char* end = nullptr;
    long v = std::strtol(level_text.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > max_level) {
      return Error::InvalidArgument("compression level must be 1.." + std::to_string(max_level) +
                                    " in '" + text + "'");
    }
    c.level = static_cast<int>(v);
  }
  return c;
}

Result<uint32_t> ClusterBits(uint64_t cluster_bytes) {
  for (uint32_t bits = 9; bits <= 21; ++bits) {
    if (cluster_bytes == (uint64_t{1} << bits)) return bits;
  }
  return Error::InvalidArgument("cluster size must be a power of two from 512 to 2M, not " +
                                std::to_string(cluster_bytes));
}

std::string DefaultCompression() {
  return CompressionChoice{formats::Compression::kZstd, formats::kDefaultZstdLevel}.ToString();
}

void CopyFlags::AddTo(CLI::App* app, const std::string& default_compress) {
  compress = default_compress;
  app->add_option("--compress", compress, "zstd[:LEVEL], deflate[:LEVEL] or none")
      ->capture_default_str();
  app->add_option("--cluster-size", cluster_size, "qcow2 cluster size (512 to 2M)")
      ->capture_default_str();
  app->add_option("--memory", memory,
                  "Ceiling on buffers for data in flight (the pool is sized by threads up to this; independent of disk size)")
      ->capture_default_str();
  app->add_option("--threads", threads, "Worker threads (0 = all cores)")->capture_default_str();
}

Status CopyFlags::Apply(pipeline::CopyOptions& options, CompressionChoice& compression) const {
  BARGE_ASSIGN_OR_RETURN(compression, ParseCompression(compress));
  BARGE_ASSIGN_OR_RETURN(uint64_t cluster, ParseSize(cluster_size));
  BARGE_RETURN_IF_ERROR(ClusterBits(cluster));
  BARGE_ASSIGN_OR_RETURN(options.memory_bytes, ParseSize(memory));
  if (options.memory_bytes < (4u << 20)) {
    return Error::InvalidArgument("--memory must be at least 4M");
  }
  if (threads < 0) return Error::InvalidArgument("--threads must be 0 or more");
  options.cluster_bytes = static_cast<uint32_t>(cluster);
  // Chunks of at least 1 MiB (large reads), at least one cluster.
  options.chunk_bytes = std::max<uint32_t>(options.cluster_bytes, 1u << 20);
  options.threads = threads;
  options.compression = compression.type;
  options.compression_level = compression.level;
  return OkStatus();
}

}  // namespace barge::cli
