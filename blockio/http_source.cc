// HttpSource: BlockSource over HttpClient's ranged reads.
#include "blockio/http_source.h"

namespace barge {
namespace {

class HttpSource final : public BlockSource {
 public:
  HttpSource(std::unique_ptr<HttpClient> client, HttpObject object, std::string name)
      : client_(std::move(client)), object_(std::move(object)), name_(std::move(name)) {}

  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return object_.length_bytes; }

  SourceCapabilities capabilities() const override {
    SourceCapabilities caps;
    // One request per read: large ones amortise the round trip.
    caps.preferred_request_bytes = 1 << 20;
    caps.parallel_reads = true;
    caps.blocking_read_streams = kStreams;
    return caps;
  }

  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    BARGE_RETURN_IF_ERROR(CheckRange(offset, out.size()));
    return client_->ReadRange(object_, offset, out);
  }

 private:
  static constexpr uint32_t kStreams = 8;  // requests in flight, as a copy's readers
  const std::unique_ptr<HttpClient> client_;
  const HttpObject object_;
  const std::string name_;
};

}  // namespace

Result<HttpSourceOpened> OpenHttpSource(const std::string& url, const HttpOptions& options) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, HttpClient::Create(url, options));
  BARGE_ASSIGN_OR_RETURN(HttpObject object, client->Probe());
  if (!object.ranges) {
    return Error::NotSupported(
               "the server does not serve byte ranges (it answered a Range request with the whole file); "
               "download it first (curl -o FILE URL) and give the file")
        .set_path(client->shown_url());
  }
  HttpSourceOpened out;
  out.object = object;
  const std::string name = client->shown_url();
  out.source = std::make_unique<HttpSource>(std::move(client), std::move(object), name);
  return out;
}

std::unique_ptr<BlockSource> MakeHttpSource(std::unique_ptr<HttpClient> client, HttpObject object, std::string name) {
  return std::make_unique<HttpSource>(std::move(client), std::move(object), std::move(name));
}

}  // namespace barge
