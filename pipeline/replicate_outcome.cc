#include "pipeline/replicate_outcome.h"

namespace barge::pipeline {

Status CheckQcow2Shaping(ReplicaFormat format, const std::string& format_flag, const std::string& source_format,
                         bool compress_given, bool cluster_size_given) {
  const bool qcow2_copies =
      format == ReplicaFormat::kQcow2 || (format == ReplicaFormat::kKeep && source_format == "qcow2");
  if (qcow2_copies || (!compress_given && !cluster_size_given)) return OkStatus();
  return Error::InvalidArgument(std::string(compress_given ? "--compress" : "--cluster-size") +
                                " applies to qcow2 copies; these copies are raw (--format " + format_flag + ", a " +
                                source_format + " source): use --format qcow2");
}

Status ReplicateOutcome(const ReplicateResult& r, const std::string& expected_sha512, const std::string& source) {
  if (r.checksum_mismatch) {
    return Error::Corruption("checksum mismatch, nothing made ready: expected sha512 " + expected_sha512 +
                             ", the source has " + r.sha512_hex)
        .set_path(source);
  }
  if (r.all_ok()) return OkStatus();
  size_t failed = 0;
  const ReplicaResult* first = nullptr;
  for (const auto& d : r.replicas) {
    if (d.state != ReplicaState::kFailed) continue;
    ++failed;
    if (first == nullptr && d.error) first = &d;
  }
  const std::string count =
      std::to_string(failed) + " of " + std::to_string(r.replicas.size()) + " copies failed (see the result for each)";
  // The first failed copy's code and file, with the count: the source was
  // read fine.
  if (first == nullptr) return Error::IoError(count);
  const Error& e = *first->error;
  return Error(e.code(), count + "; the first: " + e.message()).set_path(e.path());
}

}  // namespace barge::pipeline
