// Parsing of the copy pipeline's flags.
#include "cli/copy_flags.h"

#include <unistd.h>

#include <thread>

#include "blockio/nbd.h"
#include "cli/common.h"
#include "cli/interrupt.h"
#include "formats/qcow2_format.h"

namespace barge::cli {

std::string DefaultCompression() { return formats::CompressionSpec::Default().ToString(); }

namespace {

int MaxThreads() { return static_cast<int>(pipeline::MaxThreads()); }

uint64_t MaxMemoryBytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  uint64_t half_ram = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page / 2 : 0;
  return std::max<uint64_t>(half_ram, 64ull << 20);
}

// One reconnect as a line and an event (docs/json.md, "reconnect"). The
// URI comes without its tls-* parameters (RedactNbdUri).
void ReportReconnect(Output& out, const NbdReconnect& r) {
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", static_cast<double>(r.waited.count()) / 1000.0);
  std::string line = "reconnected: " + r.uri + ": the connection was lost (" + r.reason + "); reconnected after " +
                     std::to_string(r.attempts) + " attempt" + (r.attempts == 1 ? "" : "s") + " and " + waited +
                     " s of backoff, sending " + HumanBytes(r.reissued_bytes) + " again";
  out.Notice("reconnect", line,
             {{"uri", r.uri},
              {"reason", r.reason},
              {"attempts", r.attempts},
              {"waited_seconds", static_cast<double>(r.waited.count()) / 1000.0},
              {"reissued_bytes", r.reissued_bytes}});
}

}  // namespace

void CopyFlags::AddTo(CLI::App* app, const std::string& default_compress, unsigned which,
                      std::string why_not) {
  command_ = app->get_name();
  for (const CLI::App* p = app->get_parent(); p != nullptr && p->get_parent() != nullptr; p = p->get_parent()) {
    command_ = p->get_name() + " " + command_;
  }
  which_ = which;
  why_not_ = std::move(why_not);
  compress = default_compress;
  // Flags outside `which` stay parseable but hidden (group ""), so Apply
  // can refuse them with the reason.
  auto group = [which](unsigned flag) { return (which & flag) ? std::string("Options") : std::string(); };
  compress_option_ = app->add_option("--compress", compress, "zstd[:LEVEL], deflate[:LEVEL] or none")
                         ->capture_default_str()
                         ->group(group(kCompressFlag));
  cluster_size_option_ = app->add_option("--cluster-size", cluster_size, "qcow2 cluster size (512 to 2M)")
                             ->capture_default_str()
                             ->group(group(kClusterSizeFlag));
  memory_option_ =
      app->add_option("--memory", memory,
                      "Ceiling on buffers for data in flight (the pool is sized by threads up to this; independent of "
                      "disk size): 4M to " + HumanBytes(MaxMemoryBytes()))
          ->capture_default_str()
          ->group(group(kResourceFlags));
  threads_option_ = app->add_option("--threads", threads,
                                    "Worker threads, 1 to " + std::to_string(MaxThreads()) + " (0 = all cores)")
                        ->capture_default_str()
                        ->group(group(kResourceFlags));
  if (which & kNbdFlags) {
    app->add_option("--nbd-retries", nbd_retries,
                    "Reconnect attempts after an NBD connection drops, and retries of the first "
                    "connection when no server answers (0 to 100; 0 = fail at once); "
                    "only what was not yet transferred is sent again")
        ->capture_default_str();
    app->add_option("--nbd-retry-time", nbd_retry_time_s,
                    "Longest an NBD outage may last, in seconds, before the command fails")
        ->capture_default_str();
    app->add_option("--nbd-timeout", nbd_timeout_s,
                    "Seconds without a reply to outstanding NBD requests after which the connection "
                    "counts as dropped (0 = wait forever)")
        ->capture_default_str();
  }
}

bool CopyFlags::compress_given() const { return compress_option_ != nullptr && compress_option_->count() > 0; }

bool CopyFlags::cluster_size_given() const {
  return cluster_size_option_ != nullptr && cluster_size_option_->count() > 0;
}


Status ApplyResourceFlags(const std::string& memory, int threads, pipeline::CopyOptions& options) {
  auto mem = ParseSize(memory);
  if (!mem.ok()) return Error(mem.error()).Wrap("--memory");
  if (*mem < (4u << 20) || *mem > MaxMemoryBytes()) {
    return Error::InvalidArgument("--memory must be from 4M to " + HumanBytes(MaxMemoryBytes()) +
                                  " (half of this machine's memory), not " + memory);
  }
  if (threads < 0 || threads > MaxThreads()) {
    return Error::InvalidArgument("--threads must be from 1 to " + std::to_string(MaxThreads()) +
                                  " (0 = one per core), not " + std::to_string(threads));
  }
  options.memory_bytes = *mem;
  options.threads = threads;
  options.cancel = &CancelFlag();
  return OkStatus();
}

Status CopyFlags::Apply(pipeline::CopyOptions& options, formats::CompressionSpec& compression, Output* out) const {
  // A flag that means nothing for the command is refused, not ignored.
  const std::pair<unsigned, CLI::Option*> flags[] = {{kCompressFlag, compress_option_},
                                                     {kClusterSizeFlag, cluster_size_option_},
                                                     {kResourceFlags, memory_option_},
                                                     {kResourceFlags, threads_option_}};
  for (const auto& [flag, option] : flags) {
    if ((which_ & flag) || option == nullptr || option->count() == 0) continue;
    return Error::InvalidArgument("--" + option->get_lnames().front() + " does not apply to " + command_ +
                                  (why_not_.empty() ? "" : ": " + why_not_));
  }
  BARGE_ASSIGN_OR_RETURN(compression, formats::ParseCompressionSpec(compress));
  BARGE_ASSIGN_OR_RETURN(uint64_t cluster, ParseSize(cluster_size));
  BARGE_RETURN_IF_ERROR(formats::qcow2::ClusterBitsOf(cluster));
  BARGE_RETURN_IF_ERROR(ApplyResourceFlags(memory, threads, options));
  options.cluster_bytes = static_cast<uint32_t>(cluster);
  // Chunks of at least 1 MiB (large reads), at least one cluster.
  options.chunk_bytes = std::max<uint32_t>(options.cluster_bytes, 1u << 20);
  options.compression = compression.type;
  options.compression_level = compression.level;
  if (which_ & kNbdFlags) {
    if (nbd_retries < 0 || nbd_retries > 100) {
      return Error::InvalidArgument("--nbd-retries must be from 0 to 100, not " + std::to_string(nbd_retries));
    }
    if (!(nbd_retry_time_s >= 0 && nbd_retry_time_s <= 86400)) {
      return Error::InvalidArgument("--nbd-retry-time must be from 0 to 86400 seconds");
    }
    if (!(nbd_timeout_s >= 0 && nbd_timeout_s <= 86400)) {
      return Error::InvalidArgument("--nbd-timeout must be from 0 to 86400 seconds (0 = wait forever)");
    }
    NbdRetryPolicy& retry = options.nbd_retry;
    retry.attempts = static_cast<uint32_t>(nbd_retries);
    retry.max_time = std::chrono::milliseconds(static_cast<int64_t>(nbd_retry_time_s * 1000));
    retry.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(nbd_timeout_s * 1000));
    retry.cancel = &CancelFlag();
    if (out != nullptr) {
      retry.on_reconnect = [out](const NbdReconnect& r) { ReportReconnect(*out, r); };
    }
  }
  return OkStatus();
}

}  // namespace barge::cli
