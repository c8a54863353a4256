// NBD source and sink against real servers: nbdkit (memory, pattern,
// sparse-random, nozero and log filters) and qemu-nbd exporting a qcow2
// image with a dirty bitmap. nbdinfo is the oracle for extents.
#include "blockio/nbd.h"
#include "blockio/nbd_stats.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include "blockio/buffer.h"
#include "tests/testing/testing.h"
namespace barge {
namespace {

using ::barge::testing::RandomBytes;
using ::barge::testing::Run;
using ::barge::testing::RunOk;
using ::barge::testing::ShellQuote;
using ::barge::testing::TempDir;

using Server = ::barge::testing::SocketServer;
class BlockioNbdTest : public ::testing::Test {
 protected:
  // Starts `nbdkit ARGS` on a fresh socket in the temp dir.
  std::unique_ptr<Server> Nbdkit(const std::string& args) {
    std::string socket = dir_ / ("nbdkit" + std::to_string(counter_++) + ".sock");
    auto server =
        std::make_unique<Server>("nbdkit -f --exit-with-parent -U " + ShellQuote(socket) + " " + args, socket);
    EXPECT_TRUE(server->WaitReady()) << "nbdkit " << args;
    return server;
  }
  std::unique_ptr<Server> QemuNbd(const std::string& args) {
    std::string socket = dir_ / ("qemu" + std::to_string(counter_++) + ".sock");
    auto server = std::make_unique<Server>(
        "qemu-nbd --socket=" + ShellQuote(socket) + " " + args, socket);
    EXPECT_TRUE(server->WaitReady()) << "qemu-nbd " << args;
    return server;
  }
  TempDir dir_;
  int counter_ = 0;
};
// Parses `nbdinfo --map[=CONTEXT]` lines "offset length flags description".
std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> NbdinfoMap(const std::string& output) {
  std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    uint64_t offset, length;
    uint32_t flags;
    if (fields >> offset >> length >> flags) out.emplace_back(offset, length, flags);
  }
  return out;
}
TEST(BlockioNbdUriTest, RecognizesSchemes) {
  EXPECT_TRUE(IsNbdUri("nbd://host:10809/export"));
  EXPECT_TRUE(IsNbdUri("nbd+unix:///vda?socket=/run/x.sock"));
  EXPECT_TRUE(IsNbdUri("nbds+unix:///?socket=/s"));
  EXPECT_FALSE(IsNbdUri("/var/lib/disk.raw"));
  EXPECT_FALSE(IsNbdUri("http://example/disk"));
  auto bad = OpenNbdSource("/var/lib/disk.raw");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
}

TEST(BlockioNbdUriTest, RedactLosesCredentialsAndKeepsTheRest) {
  EXPECT_EQ(RedactNbdUri("nbd://host:10809/vda"), "nbd://host:10809/vda");
  EXPECT_EQ(RedactNbdUri("nbds://alice:secret@host/vda?tls-psk-file=/etc/keys.psk"), "nbds://host/vda");
  EXPECT_EQ(RedactNbdUri("nbds://host/vda?tls-certificates=/etc/pki&tls-verify-peer=false"), "nbds://host/vda");
  EXPECT_EQ(RedactNbdUri("nbds+unix:///vda?tls-username=u&socket=/run/s.sock&tls-psk-file=k"),
            "nbds+unix:///vda?socket=/run/s.sock");
  EXPECT_EQ(RedactNbdUri("nbd+unix:///?socket=/run/s.sock"), "nbd+unix:///?socket=/run/s.sock");
  // A parameter name spelled with percent escapes is still tls-*.
  EXPECT_EQ(RedactNbdUri("nbds://h/x?tls%2Dpsk-file=/k"), "nbds://h/x");
  // An '@' after the authority is not a user part.
  EXPECT_EQ(RedactNbdUri("nbd://host/disk@1"), "nbd://host/disk@1");
  // Not an NBD URI: unchanged.
  EXPECT_EQ(RedactNbdUri("/var/lib/a@b?tls-x=1"), "/var/lib/a@b?tls-x=1");
}

TEST(BlockioNbdUriTest, TlsParamsAndServerName) {
  EXPECT_TRUE(NbdUriRequestsTls("nbds://h/x"));
  EXPECT_TRUE(NbdUriRequestsTls("nbd://h/x?tls-psk-file=/k"));
  EXPECT_TRUE(NbdUriRequestsTls("nbd://h/x?tls-certificates=/d"));
  EXPECT_FALSE(NbdUriRequestsTls("nbd://h/x?tls-username=u"));
  EXPECT_FALSE(NbdUriRequestsTls("nbd+unix:///?socket=/s"));
  EXPECT_EQ(NbdUriParam("nbds://h/x?socket=/s&tls-psk-file=/a%20b#f", "tls-psk-file"), "/a b");
  EXPECT_EQ(NbdUriParam("nbds://h/x", "tls-psk-file"), "");
  EXPECT_EQ(NbdServerName("nbds://alice@10.0.0.2:10810/x?tls-psk-file=/k"), "10.0.0.2:10810");
  EXPECT_EQ(NbdServerName("nbd://host"), "host:10809");
  EXPECT_EQ(NbdServerName("nbd://[::1]/x"), "[::1]:10809");
  EXPECT_EQ(NbdServerName("nbd://[::1]:99/x"), "[::1]:99");
  EXPECT_EQ(NbdServerName("nbds+unix:///x?socket=/run/s"), "unix socket /run/s");
}

TEST_F(BlockioNbdTest, ConnectFailureCarriesUriAndErrno) {
  BARGE_REQUIRE_TOOL("nbdkit");  // same package family; keeps CI skips uniform
  std::string uri = "nbd+unix:///?socket=" + (dir_ / "nobody.sock");
  auto source = OpenNbdSource(uri);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.error().path(), uri);
  EXPECT_EQ(source.error().errno_value(), ENOENT);
}
// Issue 36 §9: the reconnect policy's transport hook runs before each
// retry: here it starts the server that the first attempt found missing (as
// a restarted ssh forward brings the socket back), and the open succeeds;
// a hook that says the transport is refused for good (not retryable) ends
// the open at once with its error.
TEST_F(BlockioNbdTest, Issue36RestoreTransportRunsBeforeEachRetry) {
  BARGE_REQUIRE_TOOL("nbdkit");
  const std::string socket = dir_ / "late.sock";
  std::unique_ptr<Server> server;
  int calls = 0;
  NbdOptions options;
  options.retry.first_delay = std::chrono::milliseconds(10);
  options.retry.restore_transport = [&]() -> Status {
    if (calls++ == 0) {
      server = std::make_unique<Server>("nbdkit -f --exit-with-parent -U " + ShellQuote(socket) + " memory 1M",
                                        socket);
      if (!server->WaitReady()) return Error::IoError("nbdkit did not start");
    }
    return OkStatus();
  };
  auto source = OpenNbdSource("nbd+unix:///?socket=" + socket, options);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_EQ(calls, 1);

  NbdOptions refused;
  refused.retry.first_delay = std::chrono::milliseconds(10);
  int refused_calls = 0;
  refused.retry.restore_transport = [&]() -> Status {
    ++refused_calls;
    return Error::NotSupported("the SSH server refused to forward the NBD socket");
  };
  auto none = OpenNbdSource("nbd+unix:///?socket=" + (dir_ / "nobody.sock"), refused);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::kNotSupported) << none.error().ToString();
  EXPECT_EQ(refused_calls, 1);
}

TEST_F(BlockioNbdTest, PatternReadsAreExact) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("pattern 16M");
  NbdOptions options;
  options.request_bytes = 64 * 1024;  // force splitting of the big read
  auto source = OpenNbdSource(server->uri(), options);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_EQ((*source)->size_bytes(), 16u << 20);
  EXPECT_EQ((*source)->capabilities().preferred_request_bytes, 64u * 1024);
  // The pattern plugin stores each 8-byte offset big-endian at that offset.
  std::vector<std::byte> out((1 << 20) + 13);
  uint64_t base = 3 * 4096 + 5;
  ASSERT_TRUE((*source)->ReadAt(base, out).ok());
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t pos = base + i;
    uint64_t word = pos & ~uint64_t{7};
    auto expected = std::byte((word >> (8 * (7 - (pos & 7)))) & 0xff);
    ASSERT_EQ(out[i], expected) << "at " << pos;
  }
  std::vector<std::byte> past(16);
  EXPECT_EQ((*source)->ReadAt((16 << 20) - 8, past).error().code(), ErrorCode::kInvalidArgument);
}

// The pattern plugin's byte at `pos`: each 8-byte offset stored big-endian.
std::byte PatternByte(uint64_t pos) {
  uint64_t word = pos & ~uint64_t{7};
  return std::byte((word >> (8 * (7 - (pos & 7)))) & 0xff);
}

// Many scattered requests, split into more pieces than one connection keeps
// in flight, come back exact (answers arrive in any order).
TEST_F(BlockioNbdTest, ReadManyOfScatteredRequestsIsExact) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("pattern 64M");
  NbdOptions options;
  options.request_bytes = 4096;
  auto source = OpenNbdSource(server->uri(), options);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  std::vector<std::vector<std::byte>> buffers;
  std::vector<ReadRequest> requests;
  for (uint64_t i = 0; i < 40; ++i) {
    buffers.emplace_back(4096 * (1 + i % 7) + i);  // up to 7 pieces, ragged ends
    requests.push_back({(i * 1543 % 64) << 20 | (i * 613), buffers.back(), {}});
  }
  ASSERT_TRUE((*source)->ReadMany(requests).ok());
  for (const ReadRequest& r : requests) {
    ASSERT_TRUE(r.status.ok());
    for (size_t k = 0; k < r.buffer.size(); ++k) ASSERT_EQ(r.buffer[k], PatternByte(r.offset + k)) << r.offset + k;
  }
}

// A read the server fails is that request's error, with its range; the other
// requests of the batch still complete, and so does a later read.
TEST_F(BlockioNbdTest, ReadManyFailureIsThatRequestsStatus) {
  BARGE_REQUIRE_TOOL("nbdkit");
  std::string trigger = dir_ / "fail-now";
  auto server = Nbdkit("--filter=error pattern 16M error-pread=EIO error-pread-rate=100% error-pread-file=" +
                       ShellQuote(trigger));
  auto source = OpenNbdSource(server->uri());
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  std::vector<std::byte> a(8192), b(8192);
  std::vector<ReadRequest> requests = {{0, a, {}}, {1 << 20, b, {}}};
  ASSERT_TRUE((*source)->ReadMany(requests).ok());
  { std::ofstream touch(trigger); }
  Status st = (*source)->ReadMany(requests);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kIoError) << st.error().ToString();
  for (const ReadRequest& r : requests) {
    ASSERT_FALSE(r.status.ok());
    EXPECT_EQ(r.status.error().offset(), r.offset) << r.status.error().ToString();
  }
  std::filesystem::remove(trigger);
  ASSERT_TRUE((*source)->ReadAt(4096, a).ok());
  EXPECT_EQ(a[3], PatternByte(4096 + 3));
}

// A write whose pieces the server fails is an error with a failing piece's
// range; once the server recovers, the same write succeeds.
TEST_F(BlockioNbdTest, PipelinedWriteFailureCarriesTheRange) {
  BARGE_REQUIRE_TOOL("nbdkit");
  std::string trigger = dir_ / "fail-now";
  auto server = Nbdkit("--filter=error memory 16M error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file=" +
                       ShellQuote(trigger));
  NbdOptions options;
  options.request_bytes = 4096;
  auto sink = OpenNbdSink(server->uri(), options);
  ASSERT_TRUE(sink.ok()) << sink.error().ToString();
  auto data = RandomBytes(40 * 4096, 2);  // 40 pieces: more than one connection keeps in flight
  { std::ofstream touch(trigger); }
  Status st = (*sink)->WriteAt(8192, data);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kIoError) << st.error().ToString();
  ASSERT_TRUE(st.error().offset().has_value());
  EXPECT_GE(*st.error().offset(), 8192u);
  EXPECT_LT(*st.error().offset(), 8192u + data.size());
  std::filesystem::remove(trigger);
  ASSERT_TRUE((*sink)->WriteAt(8192, data).ok());
  auto source = OpenNbdSource(server->uri());
  ASSERT_TRUE(source.ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE((*source)->ReadAt(8192, back).ok());
  EXPECT_TRUE(back == data);
}

TEST_F(BlockioNbdTest, SinkWritesZeroesTrimsAndFlushesThenSourceReadsBack) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("memory 64M");
  auto sink = OpenNbdSink(server->uri());
  ASSERT_TRUE(sink.ok()) << sink.error().ToString();
  SinkCapabilities caps = (*sink)->capabilities();
  EXPECT_TRUE(caps.can_zero);
  EXPECT_TRUE(caps.can_trim);
  EXPECT_FALSE(caps.zero_initialized);
  EXPECT_FALSE(caps.can_grow);
  auto data = RandomBytes(3 * 1024 * 1024 + 100, 1);  // > request size, unaligned
  ASSERT_TRUE((*sink)->WriteAt(1000, data).ok());
  ASSERT_TRUE((*sink)->WriteZeroes(1000 + 4096, 65536).ok());
  ASSERT_TRUE((*sink)->Trim(32 << 20, 1 << 20).ok());
  ASSERT_TRUE((*sink)->Flush().ok());
  Status beyond = (*sink)->WriteAt((64 << 20) - 10, std::span(data).first(100));
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.error().code(), ErrorCode::kNoSpace);

  std::fill(data.begin() + 4096, data.begin() + 4096 + 65536, std::byte{0});
  auto source = OpenNbd(server->uri());
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_EQ((*source)->connections(), 4u);  // nbdkit memory advertises multi-conn
  EXPECT_TRUE((*source)->capabilities().parallel_reads);
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE((*source)->ReadAt(1000, back).ok());
  EXPECT_EQ(back, data);
}

TEST_F(BlockioNbdTest, ConcurrentReadsShareConnections) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("memory 16M");
  auto data = RandomBytes(16 << 20, 2);
  {
    auto sink = OpenNbdSink(server->uri());
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE((*sink)->WriteAt(0, data).ok());
    ASSERT_TRUE((*sink)->Flush().ok());
  }
  NbdOptions options;
  options.connections = 2;  // fewer connections than threads: some wait
  auto source = OpenNbd(server->uri(), options);
  ASSERT_TRUE(source.ok());
  EXPECT_EQ((*source)->connections(), 2u);
  std::vector<int> bad(6, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> buf(100000);
      for (int i = 0; i < 20; ++i) {
        uint64_t offset = (static_cast<uint64_t>(t) * 1234567 + i * 654321) % (data.size() - buf.size());
        if (!(*source)->ReadAt(offset, buf).ok() ||
            !std::equal(buf.begin(), buf.end(), data.begin() + offset)) {
          ++bad[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 6; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}
// One connection, 64 KiB requests: a call of 256 KiB is four commands.
NbdOptions OneConnectionOf64KiB() {
  NbdOptions options;
  options.connections = 1;
  options.request_bytes = 65536;
  return options;
}

// Issue 41: concurrent calls share a connection's queue. With one
// connection and a server that answers slowly, four callers of four
// pieces each keep more than one caller's pieces in flight at once (each
// call drained its own connection before: at most 4), and every byte read
// is right.
TEST_F(BlockioNbdTest, Issue41QueueStaysFullAcrossCalls) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("--filter=delay pattern 64M rdelay=20ms");
  const NbdOptions options = OneConnectionOf64KiB();
  auto source = OpenNbd(server->uri(), options);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  ASSERT_EQ((*source)->connections(), 1u);
  EXPECT_EQ((*source)->capabilities().blocking_read_streams, 2u);
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> buf(4 * 65536);  // four commands per call
      for (int i = 0; i < 6; ++i) {
        uint64_t offset = (static_cast<uint64_t>(t) * 6 + i) * buf.size();
        std::vector<ReadRequest> one = {{offset, buf, {}}};
        if (!(*source)->ReadMany(one).ok()) {
          ++bad[t];
          continue;
        }
        for (size_t k = 0; k < buf.size(); k += 4093) {
          if (buf[k] != PatternByte(offset + k)) {
            ++bad[t];
            break;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
  EXPECT_GT(NbdMaxInFlight(**source), 4u);
  EXPECT_LE(NbdMaxInFlight(**source), 64u);
}

// A server error on a shared connection fails only the calls whose
// pieces it refused, with their ranges; the other callers' reads go on.
TEST_F(BlockioNbdTest, Issue41ServerErrorOnASharedQueueIsThatCallsOnly) {
  BARGE_REQUIRE_TOOL("nbdkit");
  // Every read fails while the trigger file exists, slowly enough that
  // the four calls' pieces are in flight together.
  std::string trigger = dir_ / "fail-now";
  auto server = Nbdkit("--filter=error --filter=delay pattern 16M rdelay=5ms error-pread=ENOSPC "
                       "error-pread-rate=100% error-pread-file=" + ShellQuote(trigger));
  const NbdOptions options = OneConnectionOf64KiB();
  auto source = OpenNbd(server->uri(), options);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  { std::ofstream touch(trigger); }
  std::vector<Status> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> buf(4 * 65536);
      std::vector<ReadRequest> one = {{static_cast<uint64_t>(t) << 20, buf, {}}};
      results[t] = (*source)->ReadMany(one);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    ASSERT_FALSE(results[t].ok()) << "thread " << t;
    EXPECT_EQ(results[t].error().code(), ErrorCode::kNoSpace) << results[t].error().ToString();
    ASSERT_TRUE(results[t].error().offset().has_value());
    EXPECT_GE(*results[t].error().offset(), static_cast<uint64_t>(t) << 20);
    EXPECT_LT(*results[t].error().offset(), (static_cast<uint64_t>(t) << 20) + 4 * 65536);
  }
  std::filesystem::remove(trigger);
  std::vector<std::byte> a(65536);
  ASSERT_TRUE((*source)->ReadAt(4096, a).ok());
  EXPECT_EQ(a[3], PatternByte(4096 + 3));
}

// Concurrent writers share the queue too, and what they wrote reads back.
TEST_F(BlockioNbdTest, Issue41ConcurrentWritesShareTheQueue) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("--filter=delay memory 16M wdelay=10ms");
  const NbdOptions options = OneConnectionOf64KiB();
  auto sink = OpenNbdSink(server->uri(), options);
  ASSERT_TRUE(sink.ok()) << sink.error().ToString();
  auto data = RandomBytes(16 << 20, 7);
  std::vector<Status> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t off = static_cast<uint64_t>(t) << 20; off < data.size(); off += 4 << 20) {
        Status s = (*sink)->WriteAt(off, std::span(data).subspan(off, 1 << 20));
        if (!s.ok() && results[t].ok()) results[t] = s;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(results[t].ok()) << results[t].error().ToString();
  ASSERT_TRUE((*sink)->Flush().ok());
  EXPECT_GT(NbdMaxInFlight(**sink), 16u);  // one call is 16 commands
  auto source = OpenNbdSource(server->uri());
  ASSERT_TRUE(source.ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE((*source)->ReadAt(0, back).ok());
  EXPECT_TRUE(back == data);
}

TEST_F(BlockioNbdTest, ExtentsMatchNbdinfoMap) {
  BARGE_REQUIRE_TOOL("nbdkit");
  BARGE_REQUIRE_TOOL("nbdinfo");
  auto server = Nbdkit("sparse-random 64M seed=7 percent=30");
  auto source = OpenNbdSource(server->uri());
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  ASSERT_TRUE((*source)->capabilities().has_extents);
  auto extents = (*source)->Extents(0, 64 << 20);
  ASSERT_TRUE(extents.ok()) << extents.error().ToString();
  ExtentList expected;
  for (auto [offset, length, flags] : NbdinfoMap(RunOk("nbdinfo --map " + ShellQuote(server->uri())))) {
    ExtentKind kind = (flags & 3) == 3 ? ExtentKind::kHole
                      : (flags & 2) ? ExtentKind::kZero
                                    : ExtentKind::kData;
    expected.push_back({offset, length, kind});
  }
  expected = MergeAdjacent(std::move(expected));
  ASSERT_GT(expected.size(), 2u);
  EXPECT_EQ(*extents, expected);

  // A window in the middle is clipped exactly, and holes read as zeros.
  const Extent& hole = expected[0].kind == ExtentKind::kHole ? expected[0] : expected[1];
  auto window = (*source)->Extents(hole.offset + 1, hole.length - 2);
  ASSERT_TRUE(window.ok());
  EXPECT_EQ(*window, (ExtentList{{hole.offset + 1, hole.length - 2, ExtentKind::kHole}}));
  std::vector<std::byte> zeros(std::min<uint64_t>(hole.length, 1 << 20));
  ASSERT_TRUE((*source)->ReadAt(hole.offset, zeros).ok());
  EXPECT_TRUE(IsAllZero(zeros));
}

TEST_F(BlockioNbdTest, FastZeroRefusalFallsBackToPlainZero) {
  BARGE_REQUIRE_TOOL("nbdkit");
  std::string log = dir_ / "nbdkit.log";
  // fastzeromode=slow: fast zero is advertised but every fast request fails
  // with ENOTSUP, as a server without cheap zeroing would.
  auto server = Nbdkit("--filter=log --filter=nozero memory 8M zeromode=plugin fastzeromode=slow logfile=" +
                       ShellQuote(log));
  auto sink = OpenNbdSink(server->uri());
  ASSERT_TRUE(sink.ok()) << sink.error().ToString();
  ASSERT_TRUE((*sink)->WriteAt(0, RandomBytes(1 << 20, 3)).ok());
  ASSERT_TRUE((*sink)->WriteZeroes(4096, 8192).ok());
  ASSERT_TRUE((*sink)->WriteZeroes(65536, 4096).ok());  // no second fast try
  ASSERT_TRUE((*sink)->Flush().ok());
  auto source = OpenNbdSource(server->uri());
  ASSERT_TRUE(source.ok());
  std::vector<std::byte> back(8192);
  ASSERT_TRUE((*source)->ReadAt(4096, back).ok());
  EXPECT_TRUE(IsAllZero(back));
  std::string text = RunOk("cat " + ShellQuote(log));
  EXPECT_NE(text.find("fast=1"), std::string::npos) << text;
  EXPECT_NE(text.find("fast=0"), std::string::npos) << text;
}
TEST_F(BlockioNbdTest, NoZeroServerGetsZeroBuffers) {
  BARGE_REQUIRE_TOOL("nbdkit");
  auto server = Nbdkit("--filter=nozero memory 8M");
  auto sink = OpenNbdSink(server->uri());
  ASSERT_TRUE(sink.ok());
  EXPECT_FALSE((*sink)->capabilities().can_zero);
  ASSERT_TRUE((*sink)->WriteAt(0, RandomBytes(1 << 20, 4)).ok());
  ASSERT_TRUE((*sink)->WriteZeroes(100, 5000).ok());
  auto source = OpenNbdSource(server->uri());
  ASSERT_TRUE(source.ok());
  std::vector<std::byte> back(5000);
  ASSERT_TRUE((*source)->ReadAt(100, back).ok());
  EXPECT_TRUE(IsAllZero(back));
}

class BlockioNbdQemuTest : public BlockioNbdTest {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    BARGE_REQUIRE_TOOL("qemu-nbd");
    image_ = dir_ / "disk.qcow2";
    RunOk("qemu-img create -q -f qcow2 " + ShellQuote(image_) + " 16M");
    // Data written before the bitmap exists is allocated but not dirty.
    RunOk("qemu-io -c 'write -q -P 0x11 8M 64k' " + ShellQuote(image_));
    RunOk("qemu-img bitmap --add --enable " + ShellQuote(image_) + " bm0");
    RunOk("qemu-io -c 'write -q -P 0xab 1M 64k' -c 'write -q -P 0xcd 5M 192k' " +
          ShellQuote(image_));
  }
  std::string image_;
};
TEST_F(BlockioNbdQemuTest, DirtyRangesAreTheWrittenRanges) {
  BARGE_REQUIRE_TOOL("nbdinfo");
  // -t keeps the server up across connections; -e 1 (the default) lets one
  // client in at a time, so the oracle runs before we connect.
  auto server = QemuNbd("-r -t -f qcow2 -B bm0 " + ShellQuote(image_));
  RangeList oracle_dirty;
  for (auto [offset, length, flags] : NbdinfoMap(
           RunOk("nbdinfo --map=qemu:dirty-bitmap:bm0 " + ShellQuote(server->uri())))) {
    if (flags & 1) oracle_dirty.push_back({offset, length});
  }
  ExtentList oracle_extents;
  for (auto [offset, length, flags] : NbdinfoMap(RunOk("nbdinfo --map " + ShellQuote(server->uri())))) {
    oracle_extents.push_back({offset, length,
                              (flags & 3) == 3 ? ExtentKind::kHole
                              : (flags & 2)    ? ExtentKind::kZero
                                               : ExtentKind::kData});
  }

  NbdOptions options;
  options.dirty_bitmap_context = "qemu:dirty-bitmap:bm0";
  auto source = OpenNbd(server->uri(), options);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  auto dirty = (*source)->DirtyRanges(0, 16 << 20);
  ASSERT_TRUE(dirty.ok()) << dirty.error().ToString();
  EXPECT_EQ(*dirty, (RangeList{{1 << 20, 64 << 10}, {5 << 20, 192 << 10}}));
  EXPECT_EQ(*dirty, NormalizeRanges(oracle_dirty));
  auto via_free_function = NbdDirtyRanges(**source, 0, 16 << 20);
  ASSERT_TRUE(via_free_function.ok());
  EXPECT_EQ(*via_free_function, *dirty);

  // A window that cuts a dirty range in half.
  auto part = (*source)->DirtyRanges((5 << 20) + 4096, 1 << 20);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(*part, (RangeList{{(5 << 20) + 4096, (192 << 10) - 4096}}));

  std::vector<std::byte> block(64 << 10);
  ASSERT_TRUE((*source)->ReadAt(1 << 20, block).ok());
  EXPECT_EQ(block, std::vector<std::byte>(block.size(), std::byte{0xab}));

  auto extents = (*source)->Extents(0, 16 << 20);
  ASSERT_TRUE(extents.ok());
  EXPECT_EQ(*extents, MergeAdjacent(oracle_extents));
  // The pre-bitmap write at 8M is allocated data but not dirty.
  bool saw_8m = false;
  for (const Extent& e : *extents) {
    if (e.offset <= (8u << 20) && e.end() > (8u << 20)) saw_8m = e.kind == ExtentKind::kData;
  }
  EXPECT_TRUE(saw_8m);
}

TEST_F(BlockioNbdQemuTest, MultiConnFollowsTheServer) {
  {
    // qemu-nbd's default --shared=1 does not advertise multi-conn.
    auto single = QemuNbd("-r -t -f qcow2 " + ShellQuote(image_));
    auto source = OpenNbd(single->uri());
    ASSERT_TRUE(source.ok()) << source.error().ToString();
    EXPECT_EQ((*source)->connections(), 1u);
    EXPECT_FALSE((*source)->capabilities().parallel_reads);
  }
  auto server = QemuNbd("-r -t -e 4 -f qcow2 " + ShellQuote(image_));
  {
    auto source = OpenNbd(server->uri());
    ASSERT_TRUE(source.ok()) << source.error().ToString();
    EXPECT_EQ((*source)->connections(), 4u);
  }
  auto sink = OpenNbdSink(server->uri());
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.error().code(), ErrorCode::kNotSupported);
  EXPECT_EQ(sink.error().errno_value(), EROFS);
}

// qemu-nbd past its --shared limit accepts the socket and never answers:
// extra connections are dropped, and a first connection times out.
TEST_F(BlockioNbdQemuTest, FullServerDoesNotHang) {
  auto server = QemuNbd("-r -t -e 2 -f qcow2 " + ShellQuote(image_));
  NbdOptions options;
  options.connections = 4;
  options.connect_timeout = std::chrono::milliseconds(300);
  auto source = OpenNbd(server->uri(), options);
  ASSERT_TRUE(source.ok()) << source.error().ToString();
  EXPECT_EQ((*source)->connections(), 2u);
  std::vector<std::byte> block(4096);
  ASSERT_TRUE((*source)->ReadAt(1 << 20, block).ok());
  EXPECT_EQ(block[0], std::byte{0xab});

  auto another = OpenNbd(server->uri(), options);
  ASSERT_FALSE(another.ok());
  EXPECT_EQ(another.error().errno_value(), ETIMEDOUT);
  EXPECT_TRUE(another.error().retryable());
}

TEST_F(BlockioNbdQemuTest, MissingBitmapContextIsNotFound) {
  auto server = QemuNbd("-r -t -f qcow2 " + ShellQuote(image_));  // no -B
  NbdOptions options;
  options.dirty_bitmap_context = "qemu:dirty-bitmap:bm0";
  auto source = OpenNbd(server->uri(), options);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.error().code(), ErrorCode::kNotFound);
  auto plain = OpenNbd(server->uri());
  ASSERT_TRUE(plain.ok()) << plain.error().ToString();
  EXPECT_EQ((*plain)->DirtyRanges(0, 4096).error().code(), ErrorCode::kNotSupported);
}

}  // namespace
}  // namespace barge
