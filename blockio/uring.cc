// io_uring backends for files and block devices. Placeholder until the
// io_uring work lands: reports NotSupported so callers use pread/pwrite.
#include "blockio/file_internal.h"

namespace barge::internal {

Result<std::unique_ptr<BlockSource>> MakeUringSource(const std::string& path, Fd& fd,
                                                     const FileInfo& info) {
  return Error::NotSupported("io_uring backend not built").set_path(path);
}

Result<std::unique_ptr<BlockSink>> MakeUringSink(const std::string& path, Fd& fd,
                                                 const FileInfo& info, bool zero_initialized) {
  return Error::NotSupported("io_uring backend not built").set_path(path);
}

}  // namespace barge::internal
