// Differential test of `barge check` against `qemu-img check`: the
// structure-aware qcow2 mutator (fuzz/qcow2_mutator.cc) damages the seed
// images of the checker's fuzz corpus a few thousand times, deterministically
// (fixed seed), both tools judge every image (`qemu-img check` one process
// per image; barge's checker in this process, and the `barge check` CLI on
// every tenth image, which must give the same exit code), and every image
// qemu-img calls clean (exit 0), corrupt (exit 2) or leaked only (exit 3)
// must get the same verdict from barge. The deliberate differences (where
// barge is stricter than qemu-img) are listed in docs/formats/qcow2.md §3.1
// and are the only ones allowed; the test counts them and prints them with
// BARGE_CHECK_DIFF_VERBOSE=1. 3000 images took 51 s on 2 cores shared with
// four other builds (load 13), 38 s of it judging.
//
// Knobs (environment, this test only): BARGE_CHECK_DIFF_IMAGES (default
// 3000) and BARGE_CHECK_DIFF_SEED (default 1) select a larger or another
// campaign; BARGE_CHECK_DIFF_KEEP=DIR copies the disagreeing images there.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "blockio/file.h"
#include "formats/image.h"
#include "formats/qcow2_check.h"
#include "fuzz/qcow2_mutator.h"
#include "tests/testing/testing.h"

// The mutator mixes in libFuzzer's byte mutations; outside libFuzzer this
// stands in for them: a few bit flips, byte sets and truncations, from a
// generator the test seeds before each image (so runs repeat exactly).
namespace {
std::mt19937_64 g_byte_rng;
}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size) {
  if (size == 0) return 0;
  const int edits = 1 + static_cast<int>(g_byte_rng() % 4);
  for (int i = 0; i < edits; ++i) {
    const size_t at = g_byte_rng() % size;
    switch (g_byte_rng() % 4) {
      case 0: data[at] ^= static_cast<uint8_t>(1u << (g_byte_rng() % 8)); break;
      case 1: data[at] = static_cast<uint8_t>(g_byte_rng()); break;
      case 2: data[at] = (g_byte_rng() % 2) ? 0 : 0xff; break;
      default:
        if (size > 1024 && g_byte_rng() % 4 == 0) size -= 1 + g_byte_rng() % std::min<size_t>(size - 1024, 4096);
        break;
    }
  }
  return std::min(size, max_size);
}

namespace barge {
namespace {

namespace fs = std::filesystem;
using ::barge::testing::ShellQuote;
using ::barge::testing::TempDir;

uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 10);
}

struct Verdict {
  int qemu = -1;
  int barge = -1;  // the checker in this process: 0-3 only
  int cli = -1;    // the `barge check` process (every tenth image), else -1
  std::string why;  // barge's refusal, or its corruption messages
};

// qemu-img check's exit codes: 0 clean, 1 could not check (open failed,
// check errors), 2 corruption, 3 leaks only, 63 not supported. `file` may
// be a shell variable ("$f"): the argument is double-quoted.
std::string QemuCheck(const std::string& file) {
  // No backing file is opened (a mutated name could be anything); data
  // files resolve against the working folder, which holds the seeds' ones.
  return "qemu-img check \"json:{\\\"driver\\\":\\\"qcow2\\\",\\\"backing\\\":null,"
         "\\\"file\\\":{\\\"driver\\\":\\\"file\\\",\\\"filename\\\":\\\"" +
         file + "\\\"}}\"";
}

// `barge check`'s verdict on `path`, in process (the CLI's rules: not a
// qcow2 file is exit 1, an error its code's exit status, else the report's).
// `why` gets the error's message when the checker refused the header, else
// the report's corruption messages, one a line (all of them, or "" when
// there are more than the report keeps).
int BargeCheck(const std::string& path, std::string* why) {
  why->clear();
  auto file = OpenFileSource(path);
  if (!file.ok()) return 1;
  auto probed = formats::ProbeFormatName(**file);
  if (!probed.ok()) return probed.error().code() == ErrorCode::kCorruption ? 2 : 1;
  if (*probed != "qcow2") return 1;
  auto report = formats::qcow2::CheckQcow2(**file);
  if (!report.ok()) {
    *why = report.error().message();
    return report.error().code() == ErrorCode::kCorruption ? 2 : 1;
  }
  uint64_t listed = 0;
  for (const std::string& m : report->messages) {
    if (m.rfind("ERROR ", 0) != 0) continue;
    *why += m + "\n";
    ++listed;
  }
  if (listed != report->corruptions) why->clear();
  return report->exit_code();
}

// Where barge is deliberately stricter than qemu-img check
// (docs/formats/qcow2.md §3.1): header rules that refuse the image before
// any count, and names with NUL bytes.
constexpr const char* kStricterRules[] = {
    "runs past the end of the file",  // L1 or snapshot table not wholly inside the file
    "lies beyond the end of the file",  // snapshot L1 table, bitmap directory or table: the same
    "appears twice",                  // a header extension given twice
    "overlaps the header",            // backing file name inside the header or extensions
    "contains NUL",                   // NUL in a backing, format, data file or bitmap name
    "and a multiple of 8",            // header_length below 104 or not a multiple of 8
};

// Whether every line of `why` is one of kStricterRules.
bool Deliberate(const std::string& why) {
  if (why.empty()) return false;
  std::istringstream in(why);
  for (std::string line; std::getline(in, line);) {
    bool known = false;
    for (const char* rule : kStricterRules) known |= line.find(rule) != std::string::npos;
    if (!known) return false;
  }
  return true;
}

TEST(Qcow2CheckOracleTest, MutatedImagesAgreeWithQemuImg) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("timeout");
  BARGE_REQUIRE_TOOL("xargs");
  const uint64_t count = EnvNumber("BARGE_CHECK_DIFF_IMAGES", 3000);
  const uint64_t base_seed = EnvNumber("BARGE_CHECK_DIFF_SEED", 1);
  const bool verbose = std::getenv("BARGE_CHECK_DIFF_VERBOSE") != nullptr;

  // The checker fuzz target's seeds: qemu-made images with data,
  // compressed (zlib, zstd), zero and ZERO_ALLOC clusters, bitmaps, a
  // snapshot, a backing name, external data files, extended L2, a v2
  // header, refcount widths 1, 16 and 64 (fuzz/make_seeds.sh).
  std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;
  const fs::path corpus = fs::path(BARGE_SOURCE_DIR) / "fuzz" / "corpus" / "qcow2_check_fuzzer";
  for (const auto& e : fs::directory_iterator(corpus)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("seed_", 0) != 0) continue;
    std::vector<std::byte> bytes = testing::ReadFile(e.path().string());
    std::vector<uint8_t> b(bytes.size());
    std::memcpy(b.data(), bytes.data(), bytes.size());
    seeds.emplace_back(name, std::move(b));
  }
  std::sort(seeds.begin(), seeds.end());
  ASSERT_GE(seeds.size(), 10u) << corpus;

  TempDir dir;
  // The data files the datafile seeds name (relative: qemu opens them from
  // its working folder).
  testing::WriteFile(dir / "data.raw", testing::RandomBytes(64 << 10, 7));
  testing::WriteFile(dir / "data2.raw", testing::RandomBytes(16 << 10, 8));
  std::vector<std::string> names;
  std::vector<std::string> origin;
  for (uint64_t i = 0; i < count; ++i) {
    const auto& [seed_name, seed] = seeds[i % seeds.size()];
    const unsigned int seed_value = static_cast<unsigned int>(base_seed * 1000003u + i);
    g_byte_rng.seed(seed_value);
    std::vector<uint8_t> img = seed;
    const size_t max_size = seed.size() + 8192;
    img.resize(max_size);
    size_t n = fuzz::MutateQcow2(img.data(), seed.size(), max_size, seed_value);
    img.resize(n);
    const std::string name = "img" + std::to_string(i) + ".qcow2";
    std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(img.data()),
                                                      static_cast<std::streamsize>(img.size()));
    names.push_back(name);
    origin.push_back(seed_name + " mutated with seed " + std::to_string(seed_value));
  }
  {
    std::ofstream list(dir / "list");
    for (const std::string& n : names) list << n << "\n";
  }
  // qemu-img judges each image, two at a time (CI has 2 cores); barge's
  // checker judges them in this process, and the barge CLI every tenth (a
  // process costs more than the check: the CLI's verdicts must be the same).
  const std::string script = "for f; do timeout 30 " + QemuCheck("$f") +
                             " >/dev/null 2>&1; q=$?; b=-1; case $f in *0.qcow2) timeout 30 " +
                             ShellQuote(testing::BargeBinary()) +
                             " check \"$f\" >/dev/null 2>&1; b=$?;; esac; echo \"$f $q $b\"; done";
  const auto start = std::chrono::steady_clock::now();
  testing::CommandResult run = testing::Run("cd " + ShellQuote(dir.path().string()) +
                                            " && xargs -P 2 -n 64 sh -c " + ShellQuote(script) +
                                            " sh <list >verdicts");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::map<std::string, Verdict> verdicts;
  uint64_t cli_runs = 0;
  {
    std::ifstream in(dir / "verdicts");
    std::string name;
    Verdict v;
    while (in >> name >> v.qemu >> v.cli) {
      v.barge = BargeCheck(dir / name, &v.why);
      if (v.cli != -1) {
        ++cli_runs;
        EXPECT_EQ(v.cli, v.barge) << name << ": barge check (CLI) and CheckQcow2 disagree";
      }
      verdicts[name] = v;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(verdicts.size(), names.size());
  EXPECT_EQ(cli_runs, (count + 9) / 10);

  // Tally: qemu's verdict x barge's verdict. Every image qemu-img judges
  // (exit 0, 2 or 3) must get the same verdict from barge, or be one of the
  // documented stricter refusals.
  std::map<std::pair<int, int>, uint64_t> table;
  uint64_t agree = 0, missed = 0, stricter = 0, no_verdict = 0;
  std::ostringstream failures, differences;
  int shown = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const Verdict& v = verdicts[names[i]];
    ++table[{v.qemu, v.barge}];
    // timeout(1) exits 124 when it kills the check, sh 128+N for a signal.
    if (v.cli != -1) {
      EXPECT_LT(v.cli, 124) << names[i] << " (" << origin[i] << "): barge check crashed or timed out";
    }
    if (v.qemu != 0 && v.qemu != 2 && v.qemu != 3) {
      ++no_verdict;  // qemu-img could not open or finish the check
      continue;
    }
    if (v.qemu == v.barge) {
      ++agree;
      continue;
    }
    // qemu clean or leaked where barge finds corruption by one of the
    // documented rules only: barge is stricter (docs/formats/qcow2.md
    // §3.1); anything else is a miss.
    const bool is_stricter = v.barge == 2 && Deliberate(v.why);
    std::string detail;
    if (!is_stricter || verbose) {
      const std::string cd = "cd " + ShellQuote(dir.path().string()) + " && ";
      detail = names[i] + " (" + origin[i] + "): qemu-img exit " + std::to_string(v.qemu) + ", barge exit " +
               std::to_string(v.barge) + "\n--- qemu-img check:\n" + testing::Run(cd + QemuCheck(names[i])).output +
               "--- barge check:\n" +
               testing::Run(cd + ShellQuote(testing::BargeBinary()) + " check " + names[i]).output;
      if (const char* keep = std::getenv("BARGE_CHECK_DIFF_KEEP")) {
        std::error_code ec;
        fs::create_directories(keep, ec);
        fs::copy_file(dir.path() / names[i], fs::path(keep) / names[i], fs::copy_options::overwrite_existing, ec);
      }
    }
    if (is_stricter) {
      ++stricter;
      if (verbose) differences << detail << "\n";
    } else {
      ++missed;
      if (shown++ < 10) failures << detail << "\n";
    }
  }
  std::ostringstream summary;
  summary << count << " images (" << cli_runs << " also through the CLI) in " << seconds << " s: " << agree
          << " agree, " << stricter
          << " where barge is stricter, " << missed << " missed, " << no_verdict
          << " that qemu-img could not check\n  (qemu exit, barge exit): count";
  for (const auto& [k, n] : table) summary << "\n  (" << k.first << ", " << k.second << "): " << n;
  std::printf("[differential] %s\n", summary.str().c_str());
  if (verbose) std::printf("%s", differences.str().c_str());
  EXPECT_EQ(missed, 0u) << summary.str() << "\n" << failures.str();
}

}  // namespace
}  // namespace barge
