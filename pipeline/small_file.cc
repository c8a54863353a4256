// Bounded whole-file reads.
#include "pipeline/small_file.h"

#include "formats/units.h"

namespace barge::pipeline {

Result<std::string> ReadSmallFile(Env& env, const std::string& path, uint64_t max_bytes) {
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(path));
  if (st.size_bytes > max_bytes) {
    return Error::Corruption("file is too large (" + formats::HumanBytesExact(st.size_bytes) + ")").set_path(path);
  }
  return env.ReadFile(path, max_bytes);
}

}  // namespace barge::pipeline
