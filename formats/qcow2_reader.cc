// qcow2 reader (placeholder until the reader lands).
#include "formats/qcow2_open.h"

namespace barge::formats {

Result<std::unique_ptr<Image>> OpenQcow2(std::unique_ptr<BlockSource> file,
                                         const std::string& path, const SourceOpener& opener,
                                         const OpenOptions& options) {
  return Error::NotSupported("qcow2 reader not built yet").set_path(path);
}

}  // namespace barge::formats
