// HttpSource: BlockSource over HttpClient's ranged reads.
#include "blockio/http_source.h"

#include "blockio/leftovers.h"
#include "blockio/staged_stream.h"

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

Result<HttpSourceOpened> OpenHttpSource(Env& env, const std::string& url, const HttpOptions& options) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, HttpClient::Create(url, options));
  BARGE_ASSIGN_OR_RETURN(HttpObject object, client->Probe());
  HttpSourceOpened out;
  out.object = object;
  if (!object.ranges) {
    // Read once, front to back, into a private file the readers seek in.
    const std::string dir = options.stage_dir.empty() ? TemporaryRoot() : options.stage_dir;
    if (options.on_sequential) options.on_sequential(client->shown_url(), object.length_bytes, dir);
    BARGE_ASSIGN_OR_RETURN(out.source, StageStream(env, dir, client->shown_url(), [&](const StreamWriter& write) {
                             return client->ReadWhole(object, write);
                           }));
    out.sequential = true;
    return out;
  }
  const std::string name = client->shown_url();
  out.source = std::make_unique<HttpSource>(std::move(client), std::move(object), name);
  return out;
}

std::unique_ptr<BlockSource> MakeHttpSource(std::unique_ptr<HttpClient> client, HttpObject object, std::string name) {
  return std::make_unique<HttpSource>(std::move(client), std::move(object), std::move(name));
}

}  // namespace barge
