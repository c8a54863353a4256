// Uploads on standard input, staged (orchestrate/catalog/image_upload.h).
#include "orchestrate/catalog/image_upload.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "blockio/staged_stream.h"
#include "pipeline/http_endpoint.h"

namespace barge::orchestrate {
namespace {

const std::string& UploadName() {
  static const std::string name(kUploadName);
  return name;
}

std::string SizeMismatch(uint64_t got, uint64_t declared, bool longer) {
  return longer ? "the stream is longer than the " + std::to_string(declared) +
                      " bytes --size declared; nothing was added"
                : "the stream ended after " + std::to_string(got) + " of the " + std::to_string(declared) +
                      " bytes --size declared (a short upload); nothing was added";
}

}  // namespace

Result<UploadHead> ReadUploadHead(const UploadSpec& spec) {
  UploadHead head;
  head.bytes.resize(4);
  size_t got = 0;
  while (got < head.bytes.size()) {
    const ssize_t n = ::read(spec.fd, head.bytes.data() + got, head.bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::FromErrno(errno, "read", UploadName());
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  head.bytes.resize(got);
  if (got == 0) {
    return Error::InvalidArgument("the stream is empty: no image came on standard input").set_path(UploadName());
  }
  static constexpr unsigned char kQcow2Magic[4] = {'Q', 'F', 'I', 0xfb};
  head.format = got == 4 && std::memcmp(head.bytes.data(), kQcow2Magic, 4) == 0 ? "qcow2" : "raw";
  return head;
}

Result<pipeline::OpenedSource> OpenUpload(Env& env, const std::string& stage_dir, const UploadSpec& spec,
                                          const UploadHead& head) {
  const std::string& name = UploadName();
  const uint64_t declared = spec.size_bytes;
  uint64_t total = 0;
  auto fill = [&](const StreamWriter& write) -> Status {
    auto checked = [&](uint64_t offset, std::span<const std::byte> bytes) -> Status {
      if (declared != 0 && offset + bytes.size() > declared) {
        return Error::IoError(SizeMismatch(offset + bytes.size(), declared, true)).set_path(name);
      }
      return write(offset, bytes);
    };
    BARGE_RETURN_IF_ERROR(checked(0, head.bytes));
    auto rest = ReadFdToEnd(spec.fd, name, [&](uint64_t offset, std::span<const std::byte> bytes) {
      return checked(head.bytes.size() + offset, bytes);
    });
    if (!rest.ok()) return rest.error();
    total = head.bytes.size() + *rest;
    return OkStatus();
  };
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> staged, StageStream(env, stage_dir, name, fill));
  if (declared != 0 && total < declared) return Error::IoError(SizeMismatch(total, declared, false)).set_path(name);
  pipeline::OpenedSource out;
  formats::OpenOptions options;
  // The format the first bytes showed, which named the copy: never probed twice.
  BARGE_ASSIGN_OR_RETURN(options.format, formats::ParseImageFormat(head.format));
  BARGE_ASSIGN_OR_RETURN(out.image, pipeline::OpenObjectImage(std::move(staged), name, options));
  return out;
}

}  // namespace barge::orchestrate
