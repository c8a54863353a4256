// Fuzzes the readers of S3 answers (blockio/s3_xml.h) and the error
// mapping (S3ErrorFor) with what a hostile object store may send: every
// reader must accept any bytes, and what parses must keep its invariants
// (part numbers in 1..10000, a truncated page carries where to go on, a
// retention date prints and reads back the same, an error line is one line).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "blockio/s3_client.h"
#include "blockio/s3_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view xml(reinterpret_cast<const char*>(data), size);
  for (std::string_view inner : barge::XmlElements(xml, "Key")) {
    if (inner.data() < xml.data() || inner.data() + inner.size() > xml.data() + xml.size()) std::abort();
  }
  (void)barge::XmlText(xml, "Code");
  if (auto objects = barge::ParseListObjectsV2(xml); objects.ok()) {
    if (objects->truncated && objects->next_token.empty()) std::abort();
  }
  if (auto parts = barge::ParseListParts(xml); parts.ok()) {
    for (const auto& p : parts->parts) {
      if (p.number < 1 || p.number > 10000) std::abort();
    }
  }
  if (auto uploads = barge::ParseListMultipartUploads(xml); uploads.ok()) {
    for (const auto& u : uploads->uploads) {
      if (u.upload_id.empty()) std::abort();
    }
  }
  if (auto id = barge::ParseInitiateMultipart(xml); id.ok() && id->empty()) std::abort();
  (void)barge::ParseObjectLockConfiguration(xml);
  if (auto retention = barge::ParseRetention(xml); retention.ok()) {
    // What parses prints back as S3 wants it, and reads back the same.
    if (barge::ParseS3IsoTime(barge::S3IsoTime(retention->until_unix)) != retention->until_unix) std::abort();
  }
  const int status = size > 0 ? 400 + data[0] % 200 : 500;
  const barge::Error e = barge::S3ErrorFor(status, xml, barge::S3Location{"bucket", "key"});
  const std::string message = e.message();
  if (message.find('\n') != std::string::npos) std::abort();
  return 0;
}
