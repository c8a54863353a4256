// The hostile-image table of docs/security.md, one test per row: each builds
// the image (qemu-img where it can, byte pokes where it will not), runs the
// real CLI (info, map, check, convert, bitmap dump) and, where the error code
// matters, OpenImage through the library, and asserts a clear error naming
// the file (or, for compression bombs, an exact bounded result), no crash,
// no sanitizer report, and peak memory and time within bounds.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "blockio/file.h"
#include "formats/image.h"
#include "formats/qcow2_bitmap.h"
#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using ::barge::testing::Barge;
using ::barge::testing::RunOk;
using ::barge::testing::ShellQuote;
using ::barge::testing::TempDir;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif
// Peak RSS a CLI run may reach on these small files (the ASan build's
// baseline is about 95 MB).
constexpr long kMaxRssKiB = kAsan ? 512 * 1024 : 256 * 1024;
constexpr int kMaxSeconds = 60;

struct Measured {
  std::string command;
  int exit_code = -1;
  std::string output;
  long max_rss_kib = 0;
};

// Runs `command` with /bin/sh under `timeout`, capturing its output and,
// with GNU time (/usr/bin/time), the peak resident memory of the command's
// process tree. (wait4 on a child of this process would count the pages
// the child shares with this process before its exec.)
Measured RunMeasured(const std::string& command, const TempDir& dir) {
  const std::string out = dir / "run.out";
  const std::string rss = dir / "run.rss";
  std::error_code ec;
  fs::remove(rss, ec);
  const bool timed = ::access("/usr/bin/time", X_OK) == 0;
  const std::string shell = (timed ? "/usr/bin/time -f %M -o " + ShellQuote(rss) + " " : std::string()) + "timeout " +
                            std::to_string(kMaxSeconds) + " " + command + " >" + ShellQuote(out) + " 2>&1";
  Measured m;
  m.command = command;
  m.exit_code = testing::Run(shell).exit_code;
  std::ifstream in(out);
  m.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  // GNU time notes a non-zero exit on a line of its own before the number.
  std::ifstream r(rss);
  for (std::string line; std::getline(r, line);) {
    if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) m.max_rss_kib = std::stol(line);
  }
  if (!timed) m.max_rss_kib = -1;
  return m;
}

// No crash, no sanitizer report, within time and memory. With
// BARGE_PRINT_RSS set, prints each run's peak RSS (docs/security.md).
void ExpectBounded(const Measured& m) {
  if (std::getenv("BARGE_PRINT_RSS")) {
    std::printf("[rss] %ld KiB exit %d: %s\n", m.max_rss_kib, m.exit_code, m.command.c_str());
  }
  EXPECT_NE(m.exit_code, 124) << "timed out after " << kMaxSeconds << " s\n" << m.output;
  EXPECT_LT(m.exit_code, 128) << "killed by a signal\n" << m.output;
  EXPECT_EQ(m.output.find("Sanitizer"), std::string::npos) << m.output;
  EXPECT_EQ(m.output.find("runtime error"), std::string::npos) << m.output;
  if (m.max_rss_kib >= 0) {  // -1: no /usr/bin/time to measure with
    EXPECT_GT(m.max_rss_kib, 0) << m.output;
    EXPECT_LT(m.max_rss_kib, kMaxRssKiB) << m.output;
  }
}

// A refusal: exit 2 for Corruption (docs/errors.md: damaged data, as
// qemu-img check for an image it cannot read), 1 for any other code;
// "barge: [command: ]<Code>: <file>: ..." with `words` in it.
void ExpectRefused(const Measured& m, const std::string& code, const std::string& file, const std::string& words,
                   int exit_code = -1) {
  ExpectBounded(m);
  if (exit_code < 0) exit_code = code == "Corruption" ? 2 : 1;
  EXPECT_EQ(m.exit_code, exit_code) << m.output;
  EXPECT_EQ(m.output.rfind("barge: ", 0), 0u) << m.output;
  EXPECT_NE(m.output.find(code + ": " + file + ": "), std::string::npos) << m.output;
  EXPECT_NE(m.output.find(words), std::string::npos) << m.output;
}

void PokeBe(const std::string& path, uint64_t offset, uint64_t value, int width) {
  uint8_t b[8];
  for (int i = width - 1; i >= 0; --i, value >>= 8) b[i] = static_cast<uint8_t>(value);
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, b, width, static_cast<off_t>(offset)), width);
  ::close(fd);
}
void Poke64(const std::string& path, uint64_t offset, uint64_t value) { PokeBe(path, offset, value, 8); }
void Poke32(const std::string& path, uint64_t offset, uint32_t value) { PokeBe(path, offset, value, 4); }
void PokeBytes(const std::string& path, uint64_t offset, const void* data, size_t n) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, data, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  ::close(fd);
}
uint64_t PeekBe(const std::string& path, uint64_t offset, int width) {
  uint8_t b[8] = {};
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  EXPECT_EQ(::pread(fd, b, width, static_cast<off_t>(offset)), width);
  ::close(fd);
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) v = (v << 8) | b[i];
  return v;
}
uint64_t Peek64(const std::string& path, uint64_t offset) { return PeekBe(path, offset, 8); }

// Offset of the header extension record of `type`, 0 if absent.
uint64_t FindExtension(const std::string& path, uint32_t type) {
  const uint64_t end = uint64_t{1} << PeekBe(path, 20, 4);
  for (uint64_t off = PeekBe(path, 100, 4); off + 8 <= end;) {
    const uint32_t t = static_cast<uint32_t>(PeekBe(path, off, 4));
    const uint32_t len = static_cast<uint32_t>(PeekBe(path, off + 4, 4));
    if (t == 0) return 0;
    if (t == type) return off;
    off += 8 + ((len + 7) & ~7u);
  }
  return 0;
}
constexpr uint32_t kExtBackingFormat = 0xe2792aca;
constexpr uint32_t kExtBitmaps = 0x23852875;
constexpr uint32_t kExtDataFile = 0x44415441;

// OpenImage as the CLI does it (files, the image's folder allowed).
Result<std::unique_ptr<formats::Image>> Open(const std::string& path, formats::OpenOptions options = {}) {
  formats::SourceOpener opener = [](const std::string& p) { return OpenFileSource(p); };
  return formats::OpenImage(path, opener, options);
}
void ExpectOpenError(const std::string& path, ErrorCode code, const std::string& words,
                     formats::OpenOptions options = {}) {
  auto image = Open(path, options);
  ASSERT_FALSE(image.ok()) << path;
  EXPECT_EQ(image.error().code(), code) << image.error().ToString();
  EXPECT_EQ(image.error().path(), path) << image.error().ToString();
  EXPECT_NE(image.error().message().find(words), std::string::npos) << image.error().ToString();
}

class HostileImagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    fs::create_directories(dir_.path() / "vm");
    fs::create_directories(dir_.path() / "elsewhere");
  }
  // vm/<name>, created by qemu-img in vm/ with `options` and a few writes.
  std::string Image(const std::string& name, const std::string& options = "", const std::string& size = "1M") {
    const std::string path = (dir_.path() / "vm" / name).string();
    RunOk("cd " + ShellQuote((dir_.path() / "vm").string()) + " && qemu-img create -q -f qcow2 " + options + " " +
          name + " " + size);
    return path;
  }
  void Write(const std::string& path, const std::string& commands) {
    RunOk("qemu-io -f qcow2 " + commands + " " + ShellQuote(path) + " >/dev/null");
  }
  // `barge <args> <path>` measured.
  Measured Cli(const std::string& args, const std::string& path) {
    return RunMeasured(Barge(args + " " + ShellQuote(path)), dir_);
  }
  // A backing name qemu-img stores as given (-u: never opened).
  void SetBacking(const std::string& path, const std::string& name, const std::string& format = "raw") {
    RunOk("qemu-img rebase -q -u -f qcow2 -F " + format + " -b " + ShellQuote(name) + " " + ShellQuote(path));
  }
  TempDir dir_;
};

// --- backing and data files -------------------------------------------------

TEST_F(HostileImagesTest, BackingFileIsAHostFile) {
  for (const std::string name : {"/etc/shadow", "../../../../../etc/passwd", "../elsewhere/base.raw"}) {
    SCOPED_TRACE(name);
    const std::string img = Image("overlay.qcow2");
    SetBacking(img, name);
    ExpectRefused(Cli("info", img), "InvalidArgument", img, "outside the allowed folders");
    ExpectRefused(Cli("convert -O raw " + ShellQuote(img), dir_ / "out.raw"), "InvalidArgument", img,
                  "outside the allowed folders");
    EXPECT_FALSE(fs::exists(dir_ / "out.raw"));
    ExpectOpenError(img, ErrorCode::kInvalidArgument, "outside the allowed folders");
    fs::remove(img);
  }
  // The folder itself (found by the qcow2_chain fuzzer): no file at all.
  for (const std::string name : {".", "sub/.."}) {
    SCOPED_TRACE(name);
    const std::string img = Image("overlay.qcow2");
    SetBacking(img, name);
    ExpectRefused(Cli("info", img), "InvalidArgument", img, "names the folder");
    fs::remove(img);
  }
  // A name inside the folder that is a symlink to a host file: names are
  // resolved (symlinks followed) before the folder rule.
  fs::create_symlink("/etc/passwd", dir_.path() / "vm" / "innocent.raw");
  const std::string img = Image("overlay.qcow2");
  SetBacking(img, "innocent.raw");
  ExpectRefused(Cli("info", img), "InvalidArgument", img, "resolves to /etc/passwd");
}

TEST_F(HostileImagesTest, BackingFileJsonOrProtocolName) {
  for (const std::string name : {"json:{\"driver\":\"raw\",\"file\":{\"filename\":\"/etc/passwd\"}}",
                                 "nbd:unix:/run/secret.sock", "http://169.254.169.254/latest/meta-data",
                                 "file:/etc/passwd", "file:base.raw"}) {
    SCOPED_TRACE(name);
    const std::string img = Image("overlay.qcow2");
    SetBacking(img, name);
    ExpectRefused(Cli("info", img), "InvalidArgument", img, "json: or protocol prefix");
    // --allow-any-path lifts the folder rule, never this one.
    ExpectRefused(Cli("info --allow-any-path", img), "InvalidArgument", img, "json: or protocol prefix");
    formats::OpenOptions any;
    any.allow_any_path = true;
    ExpectOpenError(img, ErrorCode::kInvalidArgument, "json: or protocol prefix", any);
    fs::remove(img);
  }
}

// qemu probes a backing file without a recorded format (a raw file holding
// a qcow2 header is then read as qcow2); barge never probes: reading is
// refused, and info shows the image with the missing format and its fix.
TEST_F(HostileImagesTest, BackingFileWithoutFormatIsNotProbed) {
  const std::string base = Image("base.qcow2");
  const std::string img = Image("overlay.qcow2", "-b base.qcow2 -F qcow2");
  const uint64_t ext = FindExtension(img, kExtBackingFormat);
  ASSERT_NE(ext, 0u);
  Poke32(img, ext, 0x0badf00d);  // the format record becomes an unknown one
  ExpectRefused(Cli("map", img), "InvalidArgument", img, "barge never probes formats");
  Measured info = Cli("info", img);
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("has no recorded format and barge never probes formats"), std::string::npos)
      << info.output;
  EXPECT_NE(info.output.find("qemu-img rebase -u -F"), std::string::npos) << info.output;
  ExpectOpenError(img, ErrorCode::kInvalidArgument, "never probes");
}

TEST_F(HostileImagesTest, DataFileOutsideTheFolder) {
  // Absolute, relative with .., and a host file (same length as the name
  // qemu-img wrote, poked in: qemu-img create would truncate it).
  const std::string outside = (dir_.path() / "elsewhere" / "disk.raw").string();
  for (const std::string& opt : {outside, std::string("../elsewhere/disk.raw"), std::string("host_________")}) {
    SCOPED_TRACE(opt);
    const std::string img = Image("df.qcow2", "-o data_file=" + ShellQuote(opt));
    std::string words = "outside the allowed folders";
    if (opt == "host_________") {
      const uint64_t ext = FindExtension(img, kExtDataFile);
      ASSERT_NE(ext, 0u);
      PokeBytes(img, ext + 8, "/etc/passwd//", 13);
    }
    ExpectRefused(Cli("map", img), "InvalidArgument", img, words);
    ExpectRefused(Cli("convert -O raw " + ShellQuote(img), dir_ / "out.raw"), "InvalidArgument", img, words);
    ExpectOpenError(img, ErrorCode::kInvalidArgument, words);
    // info does not open the data file: it shows the name and succeeds.
    Measured info = Cli("info", img);
    ExpectBounded(info);
    EXPECT_EQ(info.exit_code, 0) << info.output;
    fs::remove(img);
    fs::remove(dir_.path() / "vm" / "host_________");
  }
}

TEST_F(HostileImagesTest, BackingChainLoop) {
  const std::string a = Image("a.qcow2");
  const std::string b = Image("b.qcow2", "-b a.qcow2 -F qcow2");
  SetBacking(a, "b.qcow2", "qcow2");  // a -> b -> a
  // The error names the layer met twice.
  ExpectRefused(Cli("info", a), "Corruption", a, "backing chain loops back");
  ExpectRefused(Cli("map", b), "Corruption", b, "backing chain loops back");
  auto image = Open(a);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.error().code(), ErrorCode::kCorruption) << image.error().ToString();
}

TEST_F(HostileImagesTest, ImageIsItsOwnBackingFile) {
  const std::string a = Image("self.qcow2");
  SetBacking(a, "self.qcow2", "qcow2");
  ExpectRefused(Cli("info", a), "Corruption", a, "backing chain loops back");
  ExpectOpenError(a, ErrorCode::kCorruption, "loops back");
  // Through another name of the same file: a hard link (same inode).
  const std::string link = (dir_.path() / "vm" / "link.qcow2").string();
  fs::create_hard_link(a, link);
  SetBacking(a, "link.qcow2", "qcow2");
  ExpectRefused(Cli("info", a), "Corruption", link, "backing chain loops back");
}

// --- header fields ------------------------------------------------------------

TEST_F(HostileImagesTest, ClusterBitsOutOfRange) {
  for (uint32_t bits : {0u, 8u, 22u, 31u, 64u, 0xffffffffu}) {
    SCOPED_TRACE(bits);
    const std::string img = Image("cb.qcow2");
    Poke32(img, 20, bits);
    ExpectRefused(Cli("info", img), "Corruption", img, "cluster_bits");
    ExpectRefused(Cli("check", img), "Corruption", img, "cluster_bits", 2);
    ExpectOpenError(img, ErrorCode::kCorruption, "outside 9..21");
    fs::remove(img);
  }
}

TEST_F(HostileImagesTest, OversizedL1Table) {
  const std::string img = Image("l1.qcow2");
  Poke32(img, 36, 0x7fffffff);  // 16 GiB of L1 entries
  ExpectRefused(Cli("info", img), "Corruption", img, "exceed the 32 MiB limit");
  ExpectRefused(Cli("check", img), "Corruption", img, "exceed the 32 MiB limit", 2);
  // Within the limit, but the table would run past the end of the file.
  Poke32(img, 36, 4u << 20);
  ExpectRefused(Cli("info", img), "Corruption", img, "runs past the end of the file");
  ExpectOpenError(img, ErrorCode::kCorruption, "runs past the end of the file");
}

TEST_F(HostileImagesTest, OversizedRefcountTable) {
  const std::string img = Image("rt.qcow2");
  Poke32(img, 56, 0xffffffff);  // refcount_table_clusters
  ExpectRefused(Cli("info", img), "Corruption", img, "refcount table exceeds the 8 MiB limit");
  ExpectRefused(Cli("check", img), "Corruption", img, "refcount table exceeds the 8 MiB limit", 2);
}

TEST_F(HostileImagesTest, AbsurdVirtualSize) {
  {  // 8 EiB with a 1-entry L1: more than the L1 can map.
    const std::string img = Image("size.qcow2");
    Poke64(img, 24, 0x7ffffffffffffe00ull);
    ExpectRefused(Cli("info", img), "Corruption", img, "L1 table is too small");
    ExpectOpenError(img, ErrorCode::kCorruption, "L1 table is too small");
  }
  // 2 EiB, consistent (a 32 MiB L1 of 2 MiB clusters: qemu's largest): open,
  // info and check are bounded by the metadata; map was 2^31 windows of
  // 1 GiB (hours; qemu-img map takes as long), now windows scale with the
  // disk. Passes over guest data (convert, backup) stay proportional to the
  // virtual size, as qemu-img convert's do.
  const std::string huge = Image("huge.qcow2", "-o cluster_size=2M", "2305843009213693952");
  Measured info = Cli("info --json", huge);
  ExpectBounded(info);
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("2305843009213693952"), std::string::npos) << info.output;
  Measured map = Cli("map", huge);
  ExpectBounded(map);
  EXPECT_EQ(map.exit_code, 0) << map.output;
  Measured check = Cli("check", huge);
  ExpectBounded(check);
  EXPECT_EQ(check.exit_code, 0) << check.output;
}

// --- refcounts ------------------------------------------------------------------

TEST_F(HostileImagesTest, RefcountOverflow) {
  {  // 64-bit refcount of 2^64-1 on the header cluster: a leak, not a wrap.
    const std::string img = Image("rc64.qcow2", "-o refcount_bits=64");
    Write(img, "-c 'write 0 64k'");
    const uint64_t block = Peek64(img, Peek64(img, 48));
    Poke64(img, block, ~0ull);
    Measured m = Cli("check", img);
    ExpectBounded(m);
    EXPECT_EQ(m.exit_code, 3) << m.output;
    EXPECT_NE(m.output.find("Leaked cluster 0 refcount=4294967295 reference=1"), std::string::npos) << m.output;
    EXPECT_EQ(testing::Run("qemu-img check " + ShellQuote(img)).exit_code, 3);
  }
  {  // 1-bit refcounts and two L2 entries naming one data cluster: the
     // count (2) does not fit; check reports it.
    const std::string img = Image("rc1.qcow2", "-o refcount_bits=1");
    Write(img, "-c 'write 0 128k'");
    const uint64_t l2 = Peek64(img, Peek64(img, 40)) & 0x00fffffffffffe00ull;
    Poke64(img, l2 + 8, Peek64(img, l2));
    Measured m = Cli("check", img);
    ExpectBounded(m);
    EXPECT_EQ(m.exit_code, 2) << m.output;
    EXPECT_NE(m.output.find("refcount=1 reference=2"), std::string::npos) << m.output;
    EXPECT_EQ(testing::Run("qemu-img check " + ShellQuote(img)).exit_code, 2);
  }
}

// A data cluster pointing at the header or another table: reads return
// those bytes (qemu's do too); check reports the double use.
TEST_F(HostileImagesTest, DataClusterOverlapsMetadata) {
  const std::string img = Image("overlap.qcow2");
  Write(img, "-c 'write -P 0x11 0 64k'");
  const uint64_t l2 = Peek64(img, Peek64(img, 40)) & 0x00fffffffffffe00ull;
  Poke64(img, l2 + 8, 0x8000000000000000ull | Peek64(img, 48));  // guest cluster 1 -> refcount table
  Measured m = Cli("check", img);
  ExpectBounded(m);
  EXPECT_EQ(m.exit_code, 2) << m.output;
  EXPECT_NE(m.output.find("reference=2"), std::string::npos) << m.output;
  Measured c = Cli("convert -O raw " + ShellQuote(img), dir_ / "out.raw");
  ExpectBounded(c);
  EXPECT_EQ(c.exit_code, 0) << c.output;
}

// Every L1 entry names one L2 table: check read it once per entry (128 GiB
// for a 17 MB file); now once.
TEST_F(HostileImagesTest, L1EntriesShareOneL2Table) {
  const std::string img = Image("sharedl2.qcow2", "", "64T");
  Write(img, "-c 'write 0 4k'");
  const uint64_t l1 = Peek64(img, 40);
  const uint64_t entry = Peek64(img, l1);
  std::vector<uint8_t> table(8u * 131072);
  for (size_t i = 0; i < 131072; ++i) {
    for (int k = 0; k < 8; ++k) table[8 * i + k] = static_cast<uint8_t>(entry >> (56 - 8 * k));
  }
  PokeBytes(img, l1, table.data(), table.size());
  Measured m = Cli("check", img);
  ExpectBounded(m);
  EXPECT_EQ(m.exit_code, 2) << m.output;
  EXPECT_NE(m.output.find("reference=131072"), std::string::npos) << m.output;
}

// --- compressed clusters ------------------------------------------------------

// A compressed L2 entry pointing at `payload` appended to the file.
void PlantCompressed(const std::string& img, const std::vector<uint8_t>& payload) {
  const uint64_t host = fs::file_size(img);
  PokeBytes(img, host, payload.data(), payload.size());
  const uint64_t sectors = (payload.size() + 511) / 512;
  const uint64_t l2 = Peek64(img, Peek64(img, 40)) & 0x00fffffffffffe00ull;
  Poke64(img, l2, (uint64_t{1} << 62) | ((sectors - 1) << 54) | host);  // cluster_bits 16: x = 54
}

std::vector<uint8_t> DeflateZeros(size_t n) {
  std::vector<uint8_t> zeros(n), out(n / 100 + 1024);
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  s.next_in = zeros.data();
  s.avail_in = static_cast<uInt>(n);
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(out.size() - s.avail_out);
  deflateEnd(&s);
  return out;
}

TEST_F(HostileImagesTest, CompressionBombs) {
  const std::string out = dir_ / "out.raw";
  {  // deflate: 64 MiB of zeros in 64 KB. The cluster's 64 KiB come out,
     // the rest is never inflated (qemu also stops at a full cluster).
    const std::string img = Image("bomb.qcow2", "-o compression_type=zlib");
    Write(img, "-c 'write -c -P 0x61 0 64k'");
    PlantCompressed(img, DeflateZeros(64u << 20));
    Measured m = Cli("convert -O raw " + ShellQuote(img), out);
    ExpectBounded(m);
    ASSERT_EQ(m.exit_code, 0) << m.output;
    const auto bytes = testing::ReadFile(out);
    ASSERT_EQ(bytes.size(), 1u << 20);
    EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; }));
    fs::remove(out);
  }
  {  // zstd: a frame of 64 MiB of zeros; the same.
    const std::string img = Image("zbomb.qcow2", "-o compression_type=zstd");
    Write(img, "-c 'write -c -P 0x61 0 64k'");
    std::vector<uint8_t> zeros(64u << 20), frame(ZSTD_compressBound(zeros.size()));
    frame.resize(ZSTD_compress(frame.data(), frame.size(), zeros.data(), zeros.size(), 1));
    PlantCompressed(img, frame);
    Measured m = Cli("convert -O raw " + ShellQuote(img), out);
    ExpectBounded(m);
    EXPECT_EQ(m.exit_code, 0) << m.output;
    fs::remove(out);
    // A frame that asks for a 2 GiB window is refused before any allocation.
    const std::vector<uint8_t> window = {0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xa8, 0x41, 0x00, 0x00, 1, 2, 3, 4, 5, 6, 7, 8};
    PlantCompressed(img, window);
    ExpectRefused(Cli("convert -O raw " + ShellQuote(img), out), "Corruption", img, "zstd: bad compressed cluster");
    EXPECT_FALSE(fs::exists(out));
  }
  {  // A payload that yields less than a cluster.
    const std::string img = Image("short.qcow2");
    Write(img, "-c 'write -c -P 0x61 0 64k'");
    PlantCompressed(img, DeflateZeros(1000));
    ExpectRefused(Cli("convert -O raw " + ShellQuote(img), out), "Corruption", img, "yields 1000 of 65536 bytes");
  }
}

// --- snapshot and bitmap tables -------------------------------------------------

TEST_F(HostileImagesTest, SnapshotTablePointingAnywhere) {
  const std::string img = Image("snap.qcow2", "-o cluster_size=4k");
  Write(img, "-c 'write -P 1 0 64k'");
  RunOk("qemu-img snapshot -c s1 " + ShellQuote(img));
  const std::string good = dir_ / "good.qcow2";
  fs::copy_file(img, good);
  auto reset = [&] { fs::copy_file(good, img, fs::copy_options::overwrite_existing); };
  const uint64_t table = Peek64(img, 64);
  const uint64_t file_size = fs::file_size(img);

  Poke64(img, 64, 0);  // over the header
  ExpectRefused(Cli("info", img), "Corruption", img, "snapshots_offset: 0x0 is not a valid table offset");
  ExpectRefused(Cli("check", img), "Corruption", img, "snapshots_offset", 2);
  reset();
  const uint64_t past_end = (file_size + 8191) & ~uint64_t{4095};
  Poke64(img, 64, past_end);  // past the end
  ExpectRefused(Cli("info", img), "Corruption", img, "snapshots_offset");
  reset();
  PokeBe(img, 60, 65536, 4);  // 65536 snapshots in a one-entry table
  ExpectRefused(Cli("info", img), "Corruption", img, "snapshot table");
  reset();
  Poke64(img, table, past_end);  // its L1 table past the end
  ExpectRefused(Cli("info", img), "Corruption", img, "entry 0: L1 table lies beyond the end of the file");
  reset();
  Poke32(img, table + 8, 0x7fffffff);  // its L1 table larger than 32 MiB
  ExpectRefused(Cli("info", img), "Corruption", img, "L1 table larger than 32 MiB");
  reset();
  // Its L1 table is the active one: opens (reads are unaffected); check
  // reports the L1 table referenced twice with refcount 1.
  Poke64(img, table, Peek64(img, 40));
  Measured m = Cli("check", img);
  ExpectBounded(m);
  EXPECT_EQ(m.exit_code, 2) << m.output;
  reset();
  // The table is the active L1 table: whatever that parses to, no crash.
  Poke64(img, 64, Peek64(img, 40));
  m = Cli("info", img);
  ExpectBounded(m);
  m = Cli("check", img);
  ExpectBounded(m);
  EXPECT_NE(m.exit_code, 0) << m.output;
}

TEST_F(HostileImagesTest, BitmapTablesPointingAnywhere) {
  // 256 MiB at 4 KiB granularity: two table entries of 128 MiB each.
  const std::string img = Image("bm.qcow2", "-o cluster_size=4k", "256M");
  RunOk("qemu-img bitmap --add -g 4096 " + ShellQuote(img) + " b0");
  Write(img, "-c 'write -P 1 0 64k' -c 'write -P 2 128M 64k'");
  const std::string good = dir_ / "good.qcow2";
  fs::copy_file(img, good);
  auto reset = [&] { fs::copy_file(good, img, fs::copy_options::overwrite_existing); };
  const uint64_t ext = FindExtension(img, kExtBitmaps);
  ASSERT_NE(ext, 0u);
  const uint64_t dir = Peek64(img, ext + 8 + 16);
  const uint64_t table = Peek64(img, dir);

  Poke64(img, ext + 8 + 16, 0);  // directory over the header
  ExpectRefused(Cli("info", img), "Corruption", img, "directory_offset: 0x0 is not a non-zero cluster-aligned offset");
  ExpectRefused(Cli("check", img), "Corruption", img, "directory_offset", 2);
  reset();
  Poke64(img, ext + 8 + 16, (fs::file_size(img) + 8191) & ~uint64_t{4095});  // past the end
  ExpectRefused(Cli("info", img), "Corruption", img, "directory lies beyond the end of the file");
  reset();
  Poke64(img, ext + 8 + 8, 64ull << 20 | 8);  // directory_size over 64 MiB
  ExpectRefused(Cli("info", img), "Corruption", img, "directory_size");
  reset();
  // The bitmap table is the refcount table: its entries (refcount block
  // offsets) read as data clusters; dump shows whatever that means; check
  // reports the refcount table used twice.
  Poke64(img, dir, Peek64(img, 48));
  Measured m = Cli("bitmap dump " + ShellQuote(img), "b0");
  ExpectBounded(m);
  m = Cli("check", img);
  ExpectBounded(m);
  EXPECT_EQ(m.exit_code, 2) << m.output;
  reset();
  Poke64(img, table, Peek64(img, 40) & 0x00fffffffffffe00ull);  // a data cluster that is the L1 table
  m = Cli("check", img);
  ExpectBounded(m);
  EXPECT_EQ(m.exit_code, 2) << m.output;
  reset();
  // Two table entries naming one data cluster (ranges from nothing).
  ASSERT_NE(Peek64(img, table), 0u);
  ASSERT_NE(Peek64(img, table + 8), 0u);
  Poke64(img, table + 8, Peek64(img, table));
  auto image = Open(img);
  ASSERT_TRUE(image.ok()) << image.error().ToString();
  auto ranges = formats::ReadBitmapDirtyRanges(**image, "b0");
  ASSERT_FALSE(ranges.ok());
  EXPECT_EQ(ranges.error().code(), ErrorCode::kCorruption) << ranges.error().ToString();
  ExpectRefused(Cli("bitmap dump " + ShellQuote(img), "b0"), "Corruption", img, "more than one table entry");
}

}  // namespace
}  // namespace barge
