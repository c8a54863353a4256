// barge's qemu-img-like commands (map, info, compare, convert) held against
// qemu-img 7.2 field by field, on a corpus made with qemu's own tools at
// test time: cluster sizes 512 B to 2 MiB, zlib and zstd clusters, zero
// clusters (with and without their allocation) and discards, extended L2,
// an external data file, bitmaps, snapshots, a 3-layer chain, a chain over a
// raw backing file, an odd size, compat 0.10, refcount widths 1 and 64.
// docs/formats/qcow2.md, "Where barge differs from qemu-img", lists the
// deliberate differences; every other field must agree.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct CorpusImage {
  std::string name;    // file name in the corpus folder
  std::string format;  // raw or qcow2
};

// The corpus: each entry made by qemu-img / qemu-io in one shell script.
// 4 MiB disks keep the whole suite to a few seconds.
const char* kCorpusScript = R"(set -e
W() { qemu-io -f "$1" "$2" "${@:3}" >/dev/null; }
# A sparse raw file: data, holes, a zero-filled (allocated) block.
truncate -s 4M raw.img
W raw raw.img -c 'write -P 0x11 64k 4k' -c 'write -P 0x12 1M 192k' -c 'write -z 2M 64k' -c 'write -P 0 3M 64k'
# 64 KiB clusters: data, zero clusters with and without their allocation,
# a discard, compressed clusters.
qemu-img create -q -f qcow2 c64k.qcow2 4M
W qcow2 c64k.qcow2 -c 'write -P 1 0 128k' -c 'write -P 2 256k 192k' -c 'write -z 64k 64k' \
  -c 'write -z 512k 64k' -c 'discard 320k 64k' -c 'write -c -P 3 1M 64k' -c 'write -c -P 4 1088k 64k' \
  -c 'write -P 5 2M 64k'
qemu-img create -q -f qcow2 -o cluster_size=512 c512.qcow2 1M
W qcow2 c512.qcow2 -c 'write -P 1 0 1536' -c 'write -z 512 512' -c 'write -P 2 100k 3k' -c 'write -c -P 7 200k 512'
qemu-img create -q -f qcow2 -o cluster_size=2M c2m.qcow2 8M
W qcow2 c2m.qcow2 -c 'write -P 1 0 2M' -c 'write -P 2 4M 2M' -c 'write -z 6M 2M'
# zlib and zstd clusters, as qemu-img convert -c writes them.
qemu-img convert -f raw -O qcow2 -c raw.img zlib.qcow2
qemu-img convert -f raw -O qcow2 -c -o compression_type=zstd raw.img zstd.qcow2
# Extended L2: subclusters allocated, zero, unallocated in an allocated cluster.
qemu-img create -q -f qcow2 -o cluster_size=128k,extended_l2=on ext.qcow2 4M
W qcow2 ext.qcow2 -c 'write -P 1 4k 4k' -c 'write -P 2 128k 128k' -c 'write -z 136k 8k' -c 'write -z 512k 8k' \
  -c 'write -P 3 1M 12k'
# External data file, guest cluster 0 written.
qemu-img create -q -f qcow2 -o data_file=df.raw df.qcow2 4M
W qcow2 df.qcow2 -c 'write -P 1 0 64k' -c 'write -P 2 1M 64k' -c 'write -z 2M 64k'
# Bitmaps and internal snapshots.
qemu-img create -q -f qcow2 bm.qcow2 4M
W qcow2 bm.qcow2 -c 'write -P 1 0 64k'
qemu-img bitmap --add -g 65536 bm.qcow2 b0
qemu-img bitmap --add -g 131072 --disable bm.qcow2 b1
qemu-img create -q -f qcow2 snap.qcow2 4M
W qcow2 snap.qcow2 -c 'write -P 1 0 64k'
qemu-img snapshot -c first snap.qcow2
W qcow2 snap.qcow2 -c 'write -P 2 0 64k' -c 'write -P 3 1M 64k'
qemu-img snapshot -c second snap.qcow2
# A 3-layer chain; the top is larger than the layers below.
qemu-img create -q -f qcow2 base.qcow2 4M
W qcow2 base.qcow2 -c 'write -P 1 0 1M' -c 'write -P 2 2M 64k'
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 mid.qcow2 4M
W qcow2 mid.qcow2 -c 'write -P 3 512k 64k' -c 'write -z 2M 64k'
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top.qcow2 6M
W qcow2 top.qcow2 -c 'write -P 4 64k 64k' -c 'write -P 5 5M 64k'
# Over a raw backing file with holes.
qemu-img create -q -f qcow2 -b raw.img -F raw overraw.qcow2 6M
W qcow2 overraw.qcow2 -c 'write -P 6 1M 64k' -c 'write -P 7 5M 64k'
# Extended L2 over a backing file: unallocated subclusters read from it.
qemu-img create -q -f qcow2 -o cluster_size=64k,extended_l2=on -b base.qcow2 -F qcow2 extov.qcow2 4M
W qcow2 extov.qcow2 -c 'write -P 8 4k 4k' -c 'write -z 2M 4k'
# Odd size, compat 0.10, refcount widths 1 and 64.
qemu-img create -q -f qcow2 odd.qcow2 3146240
W qcow2 odd.qcow2 -c 'write -P 1 3145728 512'
qemu-img create -q -f qcow2 -o compat=0.10 v2.qcow2 4M
W qcow2 v2.qcow2 -c 'write -P 1 0 64k' -c 'write -z 1M 64k'
qemu-img create -q -f qcow2 -o refcount_bits=1 r1.qcow2 4M
W qcow2 r1.qcow2 -c 'write -P 1 0 64k'
qemu-img create -q -f qcow2 -o refcount_bits=64,lazy_refcounts=on r64.qcow2 4M
W qcow2 r64.qcow2 -c 'write -P 1 0 64k'
# Data is written in whole clusters (except with extended L2, where qemu
# writes subclusters without copy-on-write): a partial write into a fresh
# cluster leaves a hole in the host file, the image then looks
# metadata-preallocated to qemu, and qemu-img map's answer depends on the
# filesystem's writeback state (docs/formats/qcow2.md, section 8).
)";

const std::vector<CorpusImage>& Corpus() {
  static const std::vector<CorpusImage> corpus = {
      {"raw.img", "raw"},        {"c64k.qcow2", "qcow2"},    {"c512.qcow2", "qcow2"}, {"c2m.qcow2", "qcow2"},
      {"zlib.qcow2", "qcow2"},   {"zstd.qcow2", "qcow2"},    {"ext.qcow2", "qcow2"},  {"df.qcow2", "qcow2"},
      {"bm.qcow2", "qcow2"},     {"snap.qcow2", "qcow2"},    {"base.qcow2", "qcow2"}, {"mid.qcow2", "qcow2"},
      {"top.qcow2", "qcow2"},    {"overraw.qcow2", "qcow2"}, {"extov.qcow2", "qcow2"}, {"odd.qcow2", "qcow2"},
      {"v2.qcow2", "qcow2"},     {"r1.qcow2", "qcow2"},      {"r64.qcow2", "qcow2"},
  };
  return corpus;
}

class QemuImgParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveTool("qemu-img") || !HaveTool("qemu-io")) return;
    dir_ = new TempDir();
    CommandResult r = ::barge::testing::Run("cd " + ShellQuote(dir_->path().string()) + " && bash -c " +
                                            ShellQuote(kCorpusScript));
    if (r.exit_code != 0) corpus_error_ = new std::string(r.output);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    delete corpus_error_;
    corpus_error_ = nullptr;
  }
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    ASSERT_NE(dir_, nullptr);
    ASSERT_EQ(corpus_error_, nullptr) << *corpus_error_;
  }
  static std::string P(const std::string& name) { return (dir_->path() / name).string(); }
  // Commands run in the corpus folder (relative backing and data-file names
  // resolve there for qemu too), with TZ=UTC so dates print alike.
  static std::string InDir(const std::string& cmd) {
    return "cd " + ShellQuote(dir_->path().string()) + " && TZ=UTC " + cmd;
  }
  static std::string Barge(const std::string& args) { return InDir(ShellQuote(BargeBinary()) + " " + args); }
  static json QemuJson(const std::string& args) {
    std::string text = RunOk(InDir("qemu-img " + args));
    json j = json::parse(text, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << text;
    return j;
  }

  static TempDir* dir_;
  static std::string* corpus_error_;
};
TempDir* QemuImgParityTest::dir_ = nullptr;
std::string* QemuImgParityTest::corpus_error_ = nullptr;

// qemu-img map --output=json's fields, from either program.
json MapFields(const json& e) {
  json out = {{"start", e["start"]}, {"length", e["length"]}, {"depth", e["depth"]},
              {"present", e["present"]}, {"zero", e["zero"]}, {"data", e["data"]}};
  if (e.contains("offset")) out["offset"] = e["offset"];
  return out;
}

TEST_F(QemuImgParityTest, MapMatchesQemuImgFieldByField) {
  for (const CorpusImage& img : Corpus()) {
    SCOPED_TRACE(img.name);
    json q = QemuJson("map --output=json -f " + img.format + " " + img.name);
    json b = RunResult(Barge("map --json -f " + img.format + " " + img.name));
    ASSERT_TRUE(b.contains("extents")) << b.dump();
    json qf = json::array(), bf = json::array();
    for (const auto& e : q) qf.push_back(MapFields(e));
    for (const auto& e : b["extents"]) bf.push_back(MapFields(e));
    EXPECT_EQ(bf, qf) << "barge:\n" << bf.dump(1) << "\nqemu-img:\n" << qf.dump(1);
  }
}

// A data-file image's offsets point into the data file: barge's extra
// "file" field names that file, as qemu-img map's text "File" column does,
// at the path barge opened it (normalised: map gave "./df.raw" and
// "map_sub/../df.raw" for the two names below).
TEST_F(QemuImgParityTest, MapNamesTheDataFile) {
  std::string text = RunOk(InDir("qemu-img map -f qcow2 df.qcow2"));
  EXPECT_NE(text.find("df.raw"), std::string::npos) << text;
  RunOk(InDir("mkdir -p map_sub"));
  for (const std::string image : {"df.qcow2", "map_sub/../df.qcow2"}) {
    SCOPED_TRACE(image);
    json b = RunResult(Barge("map --json -f qcow2 " + image));
    size_t with_offset = 0;
    for (const auto& e : b["extents"]) {
      if (!e.contains("offset")) continue;
      ++with_offset;
      ASSERT_TRUE(e.contains("file")) << e.dump();
      EXPECT_EQ(fs::path(e["file"].get<std::string>()).filename(), "df.raw") << e.dump();
      EXPECT_EQ(e["file"], "df.raw") << e.dump();
    }
    // Guest cluster 0 is written (data file offset 0): without an extent
    // that has an offset the loop above checks nothing.
    EXPECT_GE(with_offset, 1u) << b.dump();
  }
}

std::string Compat(const json& barge_layer) {
  return barge_layer["version"].get<int>() >= 3 ? "1.1" : "0.10";
}

TEST_F(QemuImgParityTest, InfoMatchesQemuImgFieldByField) {
  for (const CorpusImage& img : Corpus()) {
    SCOPED_TRACE(img.name);
    json q = QemuJson("info --output=json -f " + img.format + " " + img.name);
    json b = RunResult(Barge("info --json -f " + img.format + " " + img.name));
    EXPECT_EQ(b["format"], q["format"]);
    EXPECT_EQ(b["virtual_size"], q["virtual-size"]);
    // Apparent and allocated size, both.
    EXPECT_EQ(b["actual_size"], q["actual-size"]);
    EXPECT_EQ(b["file_size"], fs::file_size(P(img.name)));
    if (img.format == "raw") continue;
    EXPECT_EQ(b["cluster_size"], q["cluster-size"]);
    EXPECT_EQ(b["dirty"], q["dirty-flag"]);
    const json& d = q["format-specific"]["data"];
    EXPECT_EQ(Compat(b), d["compat"]);
    EXPECT_EQ(b["refcount_bits"], d["refcount-bits"]);
    if (d.contains("corrupt")) {
      EXPECT_EQ(b["corrupt"], d["corrupt"]);
    }
    if (d.contains("compression-type")) {
      EXPECT_EQ(b["compression_type"], d["compression-type"]);
    }
    if (d.contains("lazy-refcounts")) {
      EXPECT_EQ(b["lazy_refcounts"], d["lazy-refcounts"]);
    }
    if (d.contains("extended-l2")) {
      EXPECT_EQ(b["extended_l2"], d["extended-l2"]);
    }
    EXPECT_EQ(b.value("data_file", ""), d.value("data-file", ""));
    if (d.contains("data-file-raw")) {
      EXPECT_EQ(b["data_file_raw"], d["data-file-raw"]);
    }
    EXPECT_EQ(b.value("backing_file", ""), q.value("backing-filename", ""));
    EXPECT_EQ(b.value("backing_format", ""), q.value("backing-filename-format", ""));
    json qb = d.value("bitmaps", json::array());
    ASSERT_EQ(b["bitmaps"].size(), qb.size());
    for (size_t i = 0; i < qb.size(); ++i) {
      EXPECT_EQ(b["bitmaps"][i]["name"], qb[i]["name"]);
      EXPECT_EQ(b["bitmaps"][i]["granularity"], qb[i]["granularity"]);
      const json& flags = qb[i]["flags"];
      auto has = [&](const char* f) { return std::find(flags.begin(), flags.end(), f) != flags.end(); };
      EXPECT_EQ(b["bitmaps"][i]["enabled"], has("auto"));
      EXPECT_EQ(b["bitmaps"][i]["in_use"], has("in-use"));
    }
    json qs = q.value("snapshots", json::array());
    ASSERT_EQ(b["snapshots"].size(), qs.size());
    for (size_t i = 0; i < qs.size(); ++i) {
      json bs = b["snapshots"][i];
      EXPECT_EQ(bs["id"], qs[i]["id"]);
      EXPECT_EQ(bs["name"], qs[i]["name"]);
      EXPECT_EQ(bs["vm_state_size"], qs[i]["vm-state-size"]);
      EXPECT_EQ(bs["icount"], qs[i]["icount"]);
      EXPECT_DOUBLE_EQ(bs["vm_clock_seconds"].get<double>(),
                       static_cast<double>(qs[i]["vm-clock-sec"].get<uint64_t>() * 1000000000ull +
                                           qs[i]["vm-clock-nsec"].get<uint64_t>()) / 1e9);
      std::time_t t = qs[i]["date-sec"].get<int64_t>();
      char date[32];
      std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", std::gmtime(&t));
      EXPECT_TRUE(bs["date"].get<std::string>().starts_with(date)) << bs.dump() << " vs " << date;
    }
  }
}

// The text lines qemu-img info prints for what barge also shows: the same
// words, the same values (sizes as qemu's "336 KiB"); each snapshot's VM
// CLOCK and ICOUNT (barge's date is RFC 3339 UTC, qemu's local time).
TEST_F(QemuImgParityTest, InfoTextHasQemuImgLines) {
  for (const char* name : {"snap.qcow2", "r64.qcow2", "raw.img", "c64k.qcow2"}) {
    SCOPED_TRACE(name);
    std::string format = std::string(name) == "raw.img" ? "raw" : "qcow2";
    std::string q = RunOk(InDir("qemu-img info -f " + format + " " + name));
    std::string b = RunOk(Barge("info -f " + format + " " + name));
    std::istringstream lines(q);
    std::string line;
    bool in_snapshots = false;
    while (std::getline(lines, line)) {
      std::string trimmed = line.substr(line.find_first_not_of(' '));
      bool want = trimmed.starts_with("disk size:") || trimmed.starts_with("virtual size:") ||
                  trimmed.starts_with("lazy refcounts:") || trimmed.starts_with("refcount bits:") ||
                  trimmed.starts_with("compression type:") || trimmed.starts_with("cluster_size:");
      if (want) {
        EXPECT_NE(b.find(trimmed), std::string::npos) << "missing: " << trimmed << "\n" << b;
      }
      if (trimmed.starts_with("Format specific")) in_snapshots = false;
      if (in_snapshots && !trimmed.starts_with("ID ")) {
        // ID TAG SIZE UNIT DATE TIME CLOCK [ICOUNT]
        std::istringstream row(trimmed);
        std::vector<std::string> f;
        for (std::string w; row >> w;) f.push_back(w);
        ASSERT_GE(f.size(), 7u) << trimmed;
        std::string want_line = "  " + f[0] + "  " + f[1] + "  vm state " + f[2] + " " + f[3];
        std::string tail = "  vm clock " + f[6] + (f.size() > 7 ? "  icount " + f[7] : "") + "\n";
        auto at = b.find(want_line);
        ASSERT_NE(at, std::string::npos) << want_line << "\n" << b;
        std::string barge_line = b.substr(at, b.find('\n', at) + 1 - at);
        EXPECT_TRUE(barge_line.ends_with(tail)) << barge_line << " vs " << trimmed;
      }
      if (trimmed == "Snapshot list:") in_snapshots = true;
    }
  }
}

// qemu-img compare's exit code and "Content mismatch at offset N" (N the
// start of the first differing 512-byte sector).
TEST_F(QemuImgParityTest, CompareMatchesQemuImg) {
  struct Case {
    std::string a, fa, b, fb;
  };
  // A copy of each image with one byte changed at an odd offset, and one
  // larger with a byte past the end of the smaller.
  RunOk(InDir("qemu-img convert -f qcow2 -O raw top.qcow2 top.raw && cp top.raw top-changed.raw && "
              "printf x | dd of=top-changed.raw bs=1 seek=1000003 conv=notrunc status=none && "
              "qemu-img convert -f qcow2 -O raw c64k.qcow2 c64k.raw && "
              "cp c64k.raw c64k-long.raw && truncate -s 5M c64k-long.raw && "
              "printf y | dd of=c64k-long.raw bs=1 seek=4200001 conv=notrunc status=none"));
  std::vector<Case> cases = {
      {"top.qcow2", "qcow2", "top.raw", "raw"},          {"top.qcow2", "qcow2", "top-changed.raw", "raw"},
      {"top-changed.raw", "raw", "top.qcow2", "qcow2"},  {"c64k.qcow2", "qcow2", "c64k-long.raw", "raw"},
      {"c64k.qcow2", "qcow2", "zlib.qcow2", "qcow2"},    {"zlib.qcow2", "qcow2", "zstd.qcow2", "qcow2"},
      {"overraw.qcow2", "qcow2", "raw.img", "raw"},      {"ext.qcow2", "qcow2", "extov.qcow2", "qcow2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.a + " vs " + c.b);
    CommandResult q = ::barge::testing::Run(InDir("qemu-img compare -f " + c.fa + " -F " + c.fb + " " + c.a + " " + c.b));
    CommandResult b = ::barge::testing::Run(Barge("compare -f " + c.fa + " -F " + c.fb + " " + c.a + " " + c.b));
    EXPECT_EQ(b.exit_code, q.exit_code) << q.output << b.output;
    const std::string kWord = "Content mismatch at offset ";
    auto at = q.output.find(kWord);
    if (at == std::string::npos) {
      EXPECT_EQ(b.output.find(kWord), std::string::npos) << b.output;
      continue;
    }
    std::string number = q.output.substr(at + kWord.size(), q.output.find('!', at) - at - kWord.size());
    EXPECT_NE(b.output.find(kWord + number), std::string::npos) << q.output << "\n" << b.output;
    json r = RunResult(Barge("compare --json -f " + c.fa + " -F " + c.fb + " " + c.a + " " + c.b), 1);
    EXPECT_EQ(r["first_difference"], std::stoull(number));
    EXPECT_EQ(r["first_difference"].get<uint64_t>(), r["first_difference_byte"].get<uint64_t>() / 512 * 512);
  }
}

// A backing file without a recorded format: info shows the image and what
// is missing; reading data through it stays refused.
TEST_F(QemuImgParityTest, InfoShowsAnImageWhoseBackingFormatIsMissing) {
  // qemu-img 7.2 writes the backing-format extension first (at byte 112);
  // an unknown type there leaves the format unrecorded, as in images made
  // before qemu 6.1 required -F.
  RunOk(InDir("qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 nofmt.qcow2 4M && "
              "test \"$(od -An -tx1 -j112 -N4 nofmt.qcow2)\" = ' e2 79 2a ca' && "
              "printf '\\013\\255\\360\\015' | dd of=nofmt.qcow2 bs=1 seek=112 conv=notrunc status=none"));
  json q = QemuJson("info --output=json -f qcow2 nofmt.qcow2");
  ASSERT_FALSE(q.contains("backing-filename-format")) << q.dump();
  CommandResult r = ::barge::testing::Run(Barge("info --json -f qcow2 nofmt.qcow2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  json b = ResultOf(r.stdout_text);
  EXPECT_EQ(b["backing_file"], q["backing-filename"]);
  EXPECT_EQ(b["backing_format"], "");
  EXPECT_EQ(b["virtual_size"], q["virtual-size"]);
  EXPECT_NE(r.stdout_text.find("qemu-img rebase -u -F"), std::string::npos) << r.stdout_text;
  std::string text = RunOk(Barge("info -f qcow2 nofmt.qcow2"));
  EXPECT_NE(text.find("backing file: base.qcow2"), std::string::npos) << text;
  EXPECT_NE(text.find("qemu-img rebase -u -F"), std::string::npos) << text;
  // Reading stays refused: map, compare, convert.
  RunError(Barge("map --json -f qcow2 nofmt.qcow2"), 1);
  RunError(Barge("compare --json -f qcow2 -F qcow2 nofmt.qcow2 base.qcow2"), 2);
  fs::remove(P("nofmt.qcow2"));
}

// The bytes of a file's data extents (SEEK_DATA/SEEK_HOLE): the space its
// contents take, without the filesystem's own extent-tree blocks (which
// st_blocks also counts and which depend on write order).
uint64_t DataBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return 0;
  uint64_t total = 0;
  off_t pos = 0;
  while (true) {
    off_t data = ::lseek(fd, pos, SEEK_DATA);
    if (data < 0) break;
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    total += static_cast<uint64_t>(hole - data);
    pos = hole;
  }
  ::close(fd);
  return total;
}

// check's counts as qemu-img check --output=json gives them: on every
// corpus image (allocated clusters of a data-file image whose guest cluster
// 0 is written included), and on two damaged L2 entries: a data cluster
// past the end of the file (the reference error plus OFLAG_COPIED, one
// leak) and an unaligned one (the alignment error plus the straddled
// cluster without a refcount, no leak).
TEST_F(QemuImgParityTest, CheckCountsMatchQemuImg) {
  // 64 KiB clusters: header, refcount table, refcount block, L1, then the
  // L2 table at 0x40000 and the data cluster at 0x50000.
  const char* damage = R"sh(set -e
for e in 8000000010000000 8000000000050200; do
  qemu-img create -q -f qcow2 bad$e.qcow2 1M
  qemu-io -f qcow2 -c 'write -P 1 0 64k' bad$e.qcow2 >/dev/null
  test "$(od -An -tx1 -j262144 -N8 bad$e.qcow2)" = ' 80 00 00 00 00 05 00 00'
  printf "$(echo $e | sed 's/../\\x&/g')" | dd of=bad$e.qcow2 bs=1 seek=262144 conv=notrunc status=none
done)sh";
  RunOk(InDir("bash -c " + ShellQuote(damage)));
  std::vector<std::string> images = {"bad8000000010000000.qcow2", "bad8000000000050200.qcow2"};
  for (const CorpusImage& img : Corpus()) {
    if (img.format == "qcow2") images.push_back(img.name);
  }
  for (const std::string& name : images) {
    SCOPED_TRACE(name);
    CommandResult qr = ::barge::testing::Run(InDir("qemu-img check --output=json -f qcow2 " + name + " 2>/dev/null"));
    json q = json::parse(qr.stdout_text, nullptr, false);
    ASSERT_FALSE(q.is_discarded()) << qr.output;
    CommandResult br = ::barge::testing::Run(Barge("check --json " + name));
    EXPECT_EQ(br.exit_code, qr.exit_code) << br.output;
    json b = ResultOf(br.stdout_text);
    EXPECT_EQ(b["corruptions"], q.value("corruptions", 0)) << br.stdout_text;
    EXPECT_EQ(b["leaks"], q.value("leaks", 0)) << br.stdout_text;
    EXPECT_EQ(b["allocated_clusters"], q["allocated-clusters"]);
    EXPECT_EQ(b["total_clusters"], q["total-clusters"]);
    EXPECT_EQ(b["compressed_clusters"], q.value("compressed-clusters", 0));
    EXPECT_EQ(b["fragmented_clusters"], q.value("fragmented-clusters", 0));
    EXPECT_EQ(b["image_end_offset"], q["image-end-offset"]);
  }
  EXPECT_GT(images.size(), 10u);
  for (size_t i = 0; i < 2; ++i) fs::remove(P(images[i]));
}

// convert's output takes no more space than qemu-img convert's on the same
// input (the bytes of its data extents; raw outputs also have the same
// length), and reads the same.
TEST_F(QemuImgParityTest, ConvertIsAsSparseAsQemuImg) {
  struct Out {
    std::string args_q, args_b;
    bool qcow2;
  };
  const std::vector<Out> outs = {{"-O raw", "-O raw", false},
                                 {"-O qcow2", "-O qcow2", true},
                                 {"-O qcow2 -c", "-O qcow2 --compress zlib", true}};
  for (const CorpusImage& img : Corpus()) {
    for (const Out& o : outs) {
      SCOPED_TRACE(img.name + " " + o.args_b);
      RunOk(InDir("qemu-img convert -f " + img.format + " " + o.args_q + " " + img.name + " q.out"));
      RunOk(Barge("convert --no-sync -f " + img.format + " " + o.args_b + " " + img.name + " b.out"));
      RunOk(InDir("qemu-img compare -f " + std::string(o.qcow2 ? "qcow2" : "raw") + " -F " +
                  (o.qcow2 ? "qcow2" : "raw") + " q.out b.out"));
      EXPECT_LE(DataBytes(P("b.out")), DataBytes(P("q.out")));
      if (!o.qcow2) {
        EXPECT_EQ(fs::file_size(P("b.out")), fs::file_size(P("q.out")));
      }
      fs::remove(P("q.out"));
      fs::remove(P("b.out"));
    }
  }
}

}  // namespace
}  // namespace barge::testing
