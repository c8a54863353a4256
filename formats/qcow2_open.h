// Internal entry points between image.cc and the qcow2 reader.
#pragma once

#include <memory>
#include <string>

#include "formats/image.h"

namespace barge::formats {

// A raw image over an opened file.
std::unique_ptr<Image> WrapRaw(std::unique_ptr<BlockSource> file, const std::string& path);

// Opens a qcow2 image (and, per options, its backing chain and data file)
// from its already opened file.
Result<std::unique_ptr<Image>> OpenQcow2(std::unique_ptr<BlockSource> file,
                                         const std::string& path, const SourceOpener& opener,
                                         const OpenOptions& options);

}  // namespace barge::formats
