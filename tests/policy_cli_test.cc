// barge policy check / run / runs list / forget / restore end to end on real
// images (issue 15): a policy over a qcow2 disk with a persistent bitmap
// and two raw disks, two targets and a one-minute schedule, run twice in
// one slot and again across the slot boundary (real time); retention
// across merges with every remaining point restored and compared with
// qemu-img; a reason change; a full target (a small tmpfs: the policy's
// free space rule, and the backup's own estimate); a run stopped past its max_run_time and one stopped by
// SIGTERM, both recorded failed with no partial files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "tests/policy_support.h"
#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using namespace policy_testing;

using testing::RunOk;
using testing::TempDir;

// `barge ARGS --json` with the catalog, its stdout read strictly as NDJSON
// (testing::Events): the exit code; the result event (ResultOf: one, no
// error before it), empty when the run printed none (a usage error); and,
// unless it exited 0, the error event that must end it, whose exit_code is
// the exit status (ErrorOf). A run exiting 0 has no error event.
struct CliResult {
  int exit_code = -1;
  json result = json::object();
  json error = json::object();
  std::string output;  // stdout and stderr, for messages
};
CliResult BargeJson(const std::string& args, const std::string& catalog) {
  auto r = testing::Run("BARGE_CATALOG=" + Q(catalog) + " " + Barge() + " " + args + " --json");
  CliResult c;
  c.exit_code = r.exit_code;
  c.output = r.output;
  const std::vector<json> events = testing::Events(r.stdout_text);
  if (std::any_of(events.begin(), events.end(), [](const json& e) { return e.at("event") == "result"; })) {
    c.result = testing::ResultOf(r.stdout_text);
  }
  if (r.exit_code == 0) {
    for (const json& e : events) EXPECT_NE(e.at("event"), "error") << args << ": exit 0 with an error: " << r.output;
  } else {
    c.error = testing::ErrorOf(r.stdout_text);
    EXPECT_EQ(c.error.value("exit_code", -1), r.exit_code) << args << ": " << r.output;
  }
  return c;
}

const json& SourceOf(const json& result, const std::string& name) {
  for (const auto& s : result.at("sources")) {
    if (s.at("source") == name) return s;
  }
  static const json none;
  ADD_FAILURE() << "no source " << name << " in " << result.dump();
  return none;
}

// Files under `dir` whose names say "unfinished" (staged temporaries).
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find("barge-tmp") != std::string::npos) out.push_back(e.path().string());
  }
  return out;
}

void WriteText(const std::string& path, const std::string& text) {
  testing::WriteFile(path, std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                                  reinterpret_cast<const std::byte*>(text.data()) + text.size()));
}

// The image's guest-visible contents now, as a raw file (the oracle a
// restore is compared with).
void SaveState(const std::string& image, const std::string& raw) {
  RunOk("qemu-img convert -U -f qcow2 -O raw " + Q(image) + " " + Q(raw));
}

TEST(PolicyCliTest, CheckReportsEveryProblemWithItsPlace) {
  TempDir dir;
  WriteText(dir / "bad.yaml", "name: nightly\nsources:\n  - image: disk.qcow2\nretention: 3\ntargets: [/b]\n"
                              "schedule: '0 2 * * 9'\n");
  CliResult r = BargeJson("policy check " + Q(dir / "bad.yaml"), dir / "c.db");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.result.at("valid"), false);
  std::vector<std::string> got;
  for (const auto& p : r.result.at("problems")) {
    got.push_back(std::to_string(p.at("line").get<int>()) + ":" + std::to_string(p.at("column").get<int>()) + " " +
                  p.at("message").get<std::string>());
  }
  ASSERT_EQ(got.size(), 3u) << r.output;
  EXPECT_EQ(got[0], "3:12 'image' must be an absolute path, not 'disk.qcow2'");
  EXPECT_EQ(got[1], "4:1 unknown key 'retention' in the policy (did you mean 'retention_count'?)");
  EXPECT_NE(got[2].find("6:11 'schedule': "), std::string::npos) << got[2];
  // Text mode: compiler-style lines on stderr.
  auto text = testing::Run(Barge() + " policy check " + Q(dir / "bad.yaml"));
  EXPECT_NE(text.output.find(dir / "bad.yaml" + ":4:1: unknown key 'retention'"), std::string::npos) << text.output;

  WriteText(dir / "ok.yaml", "name: nightly\nsources:\n  - image: /vm/disk.qcow2\n    bitmap: cbt0\n"
                             "  - domain: vm1\n    tracker: nightly\nreason: ''\n"
                             "schedule: 'CRON_TZ=Europe/Berlin 0 2 * * *'\nmax_duration_without_backup: 26h\n"
                             "retention_count: 15\ntargets: [/backups/a, /backups/b]\nfree_space_multiple: 2\n");
  r = BargeJson("policy check " + Q(dir / "ok.yaml") + " --from 2026-11-24T12:00:00Z", dir / "c.db");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.result.at("valid"), true);
  EXPECT_EQ(r.result.at("policy"), "nightly");
  EXPECT_EQ(r.result.at("time_zone"), "Europe/Berlin");
  EXPECT_EQ(r.result.at("max_duration_without_backup_seconds"), 26 * 3600);
  EXPECT_EQ(r.result.at("next_runs"), json({"2026-11-25T01:00:00Z", "2026-11-26T01:00:00Z", "2026-11-27T01:00:00Z",
                                            "2026-11-28T01:00:00Z", "2026-11-29T01:00:00Z"}));
  EXPECT_EQ(r.result.at("sources").size(), 2u);
  // Each source says how its incrementals find changes: the bitmap here;
  // a domain's tracker decides (null).
  EXPECT_EQ(r.result.at("sources").at(0).at("changed_by"), "bitmap");
  EXPECT_TRUE(r.result.at("sources").at(1).at("changed_by").is_null());
  EXPECT_EQ(r.result.at("sources").at(1).at("quiesce"), true);
  EXPECT_FALSE(r.result.at("sources").at(0).contains("quiesce"));

  // An image without a bitmap defaults to digests; a written changed_by shows.
  WriteText(dir / "dig.yaml", "name: d\nsources:\n  - image: /vm/a.raw\n  - image: /vm/b.raw\n    changed_by: full\n"
                              "  - image: /vm/c.qcow2\n    bitmap: cbt0\n    changed_by: bitmap+digests\n"
                              "retention_count: 3\ntargets: [/backups/a]\n");
  r = BargeJson("policy check " + Q(dir / "dig.yaml"), dir / "c.db");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.result.at("sources").at(0).at("changed_by"), "digests");
  EXPECT_EQ(r.result.at("sources").at(1).at("changed_by"), "full");
  EXPECT_EQ(r.result.at("sources").at(2).at("changed_by"), "bitmap+digests");
  text = testing::Run(Barge() + " policy check " + Q(dir / "dig.yaml"));
  EXPECT_NE(text.output.find("a.raw, incrementals by SHA-256 digests (changed_by: digests)"), std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("b.raw, every backup full (changed_by: full)"), std::string::npos) << text.output;

  // A domain without a guest agent: quiesce: false shows in both forms.
  WriteText(dir / "noagent.yaml", "name: n\nsources:\n  - domain: vm1\n    quiesce: false\ntargets: [/backups/a]\n");
  r = BargeJson("policy check " + Q(dir / "noagent.yaml"), dir / "c.db");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.result.at("sources").at(0).at("quiesce"), false);
  text = testing::Run(Barge() + " policy check " + Q(dir / "noagent.yaml"));
  EXPECT_NE(text.output.find("domain vm1, tracker n, not quiesced (quiesce: false)"), std::string::npos)
      << text.output;
}

// Issue 18: `policy check` warns about what a run would meet: a missing
// target, a missing image, a bitmap the image lacks (the file stays valid).
TEST(PolicyCliTest, CheckWarnsAboutMissingTargetImageAndBitmap) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  const std::string vm = dir / "vm.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + Q(vm) + " 1M");
  fs::create_directories(dir / "t");
  WriteText(dir / "p.yaml", "name: w\nsources:\n  - image: " + vm + "\n    bitmap: cbt0\n  - image: " +
                                (dir / "gone.raw") + "\ntargets: [" + (dir / "t") + ", " + (dir / "nowhere") +
                                "]\n");
  CliResult r = BargeJson("policy check " + Q(dir / "p.yaml"), dir / "c.db");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.result.at("valid"), true);
  EXPECT_EQ(r.result.at("warnings"),
            json({"target " + (dir / "nowhere") + ": does not exist",
                  "source vm: image " + vm + " has no bitmap cbt0: every backup is full until the first one adds it",
                  "source gone: image " + (dir / "gone.raw") + ": does not exist"}))
      << r.output;
  auto text = testing::Run(Barge() + " policy check " + Q(dir / "p.yaml"));
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_NE(text.output.find("with 3 warning(s)"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("has no bitmap cbt0"), std::string::npos) << text.output;
  // All present: no warning.
  RunOk("qemu-img bitmap --add --enable " + Q(vm) + " cbt0");
  WriteText(dir / "p.yaml", "name: w\nsources:\n  - image: " + vm + "\n    bitmap: cbt0\ntargets: [" + (dir / "t") +
                                "]\n");
  r = BargeJson("policy check " + Q(dir / "p.yaml"), dir / "c.db");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.result.at("warnings"), json::array()) << r.output;
}

// Issue 18: two policy files with one name and a common target. The first
// run claims TARGET/NAME (.barge-policy names its file); the other file's
// run, serve pass and forget are refused naming the first file, and
// `policy check` warns.
TEST(PolicyCliTest, TwoPolicyFilesWithOneNameAreRefused) {
  TempDir dir;
  const std::string cat = dir / "catalog.db";
  testing::WriteFile(dir / "a.raw", testing::RandomBytes(1 << 20, 21));
  fs::create_directories(dir / "t");
  fs::create_directories(dir / "one");
  fs::create_directories(dir / "two");
  const std::string body = "name: same\nsources:\n  - image: " + (dir / "a.raw") + "\ntargets: [" + (dir / "t") +
                           "]\nfree_space_multiple: 0\n";
  const std::string first_path = dir / "one/p.yaml", second = dir / "two/p.yaml";
  WriteText(first_path, body);
  WriteText(second, body);
  const std::string first = fs::canonical(first_path).string();
  ASSERT_EQ(BargeJson("run --force --policy " + Q(first), cat).exit_code, 0);
  EXPECT_EQ(Slurp(dir / "t/same/.barge-policy"), first + "\n");
  ASSERT_EQ(Manifests(dir / "t"), 1u);

  CliResult r = BargeJson("run --force --policy " + Q(second), cat);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.error.value("code", ""), "InvalidArgument") << r.output;
  EXPECT_NE(r.error.value("message", "").find("belongs to policy file " + first), std::string::npos) << r.output;
  EXPECT_EQ(Manifests(dir / "t"), 1u);
  CliResult f = BargeJson("forget --policy " + Q(second) + " --keep-last 1", cat);
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_NE(f.error.value("message", "").find("belongs to policy file " + first), std::string::npos) << f.output;

  CliResult check = BargeJson("policy check " + Q(second), cat);
  ASSERT_EQ(check.exit_code, 0) << check.output;
  ASSERT_EQ(check.result.at("warnings").size(), 1u) << check.output;
  EXPECT_NE(check.result.at("warnings")[0].get<std::string>().find("belongs to policy file " + first),
            std::string::npos);
  EXPECT_EQ(BargeJson("policy check " + Q(first), cat).result.at("warnings"), json::array());
  // The owner's own runs go on.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_EQ(BargeJson("run --force --policy " + Q(first), cat).exit_code, 0);
  EXPECT_EQ(Manifests(dir / "t"), 2u);
}

TEST(PolicyCliTest, ScheduleAcrossSlotsRetentionRestoreAndReasonChange) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir dir;
  const std::string vm = dir / "vm.qcow2", a = dir / "a.raw", b = dir / "b.raw", cat = dir / "catalog.db";
  RunOk("qemu-img create -q -f qcow2 " + Q(vm) + " 16M && qemu-io -f qcow2 -c 'write -P 0x11 0 6M' " + Q(vm) +
        " >/dev/null && qemu-img bitmap --add --enable " + Q(vm) + " cbt0");
  testing::WriteFile(a, testing::RandomBytes(3 << 20, 1));
  RunOk("truncate -s 8M " + Q(b) + " && qemu-io -f raw -c 'write -P 0x5a 1M 1M' " + Q(b) + " >/dev/null");
  fs::create_directories(dir / "t1");
  fs::create_directories(dir / "t2");
  // a: every backup full (changed_by full); b: no bitmap, so digest
  // incrementals (the default).
  const std::string policy_head = "name: e2e\nsources:\n  - image: " + vm + "\n    bitmap: cbt0\n  - image: " + a +
                                  "\n    changed_by: full\n  - image: " + b + "\n";
  const std::string policy_tail = "schedule: '* * * * *'\nretention_count: 3\nmax_parallel: 2\ntargets: [" +
                                  (dir / "t1") + ", " + (dir / "t2") + "]\nfree_space_multiple: 1\n"
                                  "max_duration_without_backup: 1h\n";
  const std::string policy = dir / "e2e.yaml";
  WriteText(policy, policy_head + policy_tail);
  const std::string run = "run --policy " + Q(policy);

  // Two runs inside one slot: the first backs up everything (never backed
  // up), the second finds nothing due.
  if (SecondsIntoMinute() > 50) SleepPastNextMinute();
  std::map<std::string, std::string> state_of;  // vm point id -> raw copy of the disk then
  SaveState(vm, dir / "state0.raw");
  CliResult r1 = BargeJson(run + " --metrics-textfile " + Q(dir / "barge.prom"), cat);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_EQ(r1.result.at("ran"), 3);
  EXPECT_EQ(r1.result.at("failed"), 0);
  EXPECT_EQ(r1.result.at("metrics_textfile"), dir / "barge.prom");
  for (const char* s : {"vm", "a", "b"}) {
    const json& src = SourceOf(r1.result, s);
    EXPECT_EQ(src.at("result"), "success") << src.dump();
    EXPECT_EQ(src.at("trigger"), "schedule");
    EXPECT_EQ(src.at("due_reason"), "never backed up");
    EXPECT_EQ(src.at("type"), "full");
  }
  state_of[SourceOf(r1.result, "vm").at("points")[0].at("id")] = dir / "state0.raw";
  const std::string a_first_target = SourceOf(r1.result, "a").at("target");

  CliResult r2 = BargeJson(run, cat);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  if (r2.result.at("started_at").get<std::string>().substr(0, 16) ==
      r1.result.at("started_at").get<std::string>().substr(0, 16)) {
    EXPECT_EQ(r2.result.at("ran"), 0) << r2.output;
    EXPECT_EQ(SourceOf(r2.result, "vm").at("result"), "not_due");
    EXPECT_EQ(SourceOf(r2.result, "vm").at("due_reason").get<std::string>().rfind("next slot ", 0), 0u);
  }

  // The node-exporter textfile of the first run.
  std::string prom = Slurp(dir / "barge.prom");
  EXPECT_NE(prom.find("barge_policy_runs_total{policy=\"e2e\",source=\"vm\",result=\"success\"} 1"),
            std::string::npos)
      << prom;
  EXPECT_NE(prom.find("barge_policy_retained_points{policy=\"e2e\",source=\"a\"} 1"), std::string::npos) << prom;
  EXPECT_NE(prom.find("barge_policy_max_duration_without_backup_seconds{policy=\"e2e\",source=\"b\"} 3600"),
            std::string::npos);
  if (testing::HaveTool("promtool")) RunOk("promtool check metrics < " + Q(dir / "barge.prom"));

  // Across the slot boundary: due again (schedule); the bitmap makes the
  // qcow2 an incremental, digests the raw disk b's; a's new chain (every
  // backup full) goes to the other target (fewest successful backups of
  // the source).
  RunOk("qemu-io -f qcow2 -c 'write -P 0x22 1M 64k' " + Q(vm) + " >/dev/null");
  SaveState(vm, dir / "state1.raw");
  SleepPastNextMinute();
  CliResult r3 = BargeJson(run, cat);
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  EXPECT_EQ(r3.result.at("ran"), 3) << r3.output;
  EXPECT_EQ(SourceOf(r3.result, "vm").at("type"), "incremental");
  EXPECT_EQ(SourceOf(r3.result, "vm").at("trigger"), "schedule");
  EXPECT_EQ(SourceOf(r3.result, "vm").at("due_reason").get<std::string>().rfind("slot ", 0), 0u);
  EXPECT_LT(SourceOf(r3.result, "vm").at("bytes_read").get<uint64_t>(), 1u << 20);  // only the changed cluster
  EXPECT_NE(SourceOf(r3.result, "a").at("target"), a_first_target);
  EXPECT_EQ(SourceOf(r3.result, "a").at("type"), "full");
  EXPECT_EQ(SourceOf(r3.result, "b").at("type"), "incremental") << SourceOf(r3.result, "b").dump();
  EXPECT_EQ(SourceOf(r3.result, "b").at("target"), SourceOf(r1.result, "b").at("target"));
  state_of[SourceOf(r3.result, "vm").at("points")[0].at("id")] = dir / "state1.raw";

  // Retention across merges: three more points of the qcow2 (forced runs,
  // changes between them); retention_count 3 merges the oldest forward.
  for (int i = 2; i <= 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // backup ids tell time to the second
    RunOk("qemu-io -f qcow2 -c 'write -P " + std::to_string(0x30 + i) + " " + std::to_string(i + 2) + "M 128k' " +
          Q(vm) + " >/dev/null");
    const std::string state = dir / ("state" + std::to_string(i) + ".raw");
    SaveState(vm, state);
    CliResult r = BargeJson(run + " --force --source vm", cat);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(r.result.at("ran"), 1);
    const json& src = SourceOf(r.result, "vm");
    EXPECT_EQ(src.at("trigger"), "manual");
    EXPECT_EQ(src.at("type"), "incremental") << src.dump();
    if (i >= 3) {
      EXPECT_EQ(src.at("retention"), "1 point(s) removed") << src.dump();
    }
    state_of[src.at("points")[0].at("id")] = state;
  }
  const std::string chain = SourceOf(r1.result, "vm").at("points")[0].at("chain_dir");
  std::set<std::string> ids;
  for (const auto& e : fs::directory_iterator(chain)) {
    if (e.path().extension() == ".json") ids.insert(e.path().stem().string());
  }
  ASSERT_EQ(ids.size(), 3u);
  // Every remaining point restores to the disk as it was when it was taken.
  for (const auto& id : ids) {
    ASSERT_TRUE(state_of.count(id)) << id;
    const std::string out = dir / ("restored-" + id + ".raw");
    CliResult rr = BargeJson("restore " + Q(chain) + " --at " + Q(id) + " --to " + Q(out) + " --no-sync", cat);
    ASSERT_EQ(rr.exit_code, 0) << rr.output;
    RunOk("qemu-img compare -q -f raw -F raw " + Q(out) + " " + Q(state_of[id]));
  }
  RunOk("qemu-img check -q " + Q(vm));
  // The records of the merged points say so; the newest are present.
  CliResult runs = BargeJson("runs list --policy " + Q(policy) + " --source vm", cat);
  ASSERT_EQ(runs.exit_code, 0) << runs.output;
  ASSERT_EQ(runs.result.at("runs").size(), 5u);
  EXPECT_EQ(runs.result.at("runs")[0].at("point_state"), "present");
  EXPECT_EQ(runs.result.at("runs")[4].at("point_state"), "removed");
  EXPECT_EQ(runs.result.at("runs")[4].at("result"), "success");

  // A changed reason: every source once (a one-time backup), then no more.
  WriteText(policy, policy_head + "reason: before-upgrade\n" + policy_tail);
  CliResult r4 = BargeJson(run, cat);
  ASSERT_EQ(r4.exit_code, 0) << r4.output;
  EXPECT_EQ(r4.result.at("ran"), 3);
  for (const char* s : {"vm", "a", "b"}) {
    EXPECT_EQ(SourceOf(r4.result, s).at("trigger"), "reason");
    EXPECT_EQ(SourceOf(r4.result, s).at("due_reason"), "reason changed from '' to 'before-upgrade'");
  }
  CliResult r5 = BargeJson(run, cat);
  ASSERT_EQ(r5.exit_code, 0) << r5.output;
  for (const auto& s : r5.result.at("sources")) EXPECT_NE(s.at("trigger"), "reason") << s.dump();
  EXPECT_TRUE(Leftovers(dir / "t1").empty() && Leftovers(dir / "t2").empty());
}

TEST(PolicyCliTest, FullTargetFailsTheSourceOthersGoOn) {
  TempDir dir;
  const std::string big = dir / "big.raw", small = dir / "small.raw", cat = dir / "catalog.db";
  testing::WriteFile(big, testing::RandomBytes(12 << 20, 2));  // incompressible
  testing::WriteFile(small, testing::RandomBytes(1 << 20, 3));
  TmpfsMount tmpfs(dir / "full", "8m");
  const std::string target = tmpfs.mounted() ? dir / "full" : dir / "t";
  fs::create_directories(target);
  // Without a tmpfs (not root), the free space rule makes the target "full".
  const std::string multiple = tmpfs.mounted() ? "1" : "1000";
  const std::string policy = dir / "p.yaml";
  auto write_policy = [&](const std::string& m) {
    WriteText(policy, "name: full\nsources:\n  - image: " + big + "\n  - image: " + small + "\ntargets: [" + target +
                          "]\nfree_space_multiple: " + m + "\n");
  };
  write_policy(multiple);
  CliResult r = BargeJson("run --force --policy " + Q(policy), cat);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.result.at("failed"), 1);
  const json& b = SourceOf(r.result, "big");
  EXPECT_EQ(b.at("result"), "failed");
  EXPECT_NE(b.at("error").get<std::string>().find("NoSpace"), std::string::npos) << b.dump();
  EXPECT_NE(b.at("error").get<std::string>().find("no target qualifies"), std::string::npos) << b.dump();
  if (tmpfs.mounted()) {
    EXPECT_EQ(SourceOf(r.result, "small").at("result"), "success") << r.output;
  }
  EXPECT_EQ(Manifests(target + "/full/big"), 0u);
  if (!tmpfs.mounted()) {
    GTEST_SKIP() << "tmpfs not mounted (needs root): checked the free-space rule only";
  }
  // The policy's check off: the backup's own estimate (every allocated
  // byte stored uncompressed, plus metadata) refuses the small filesystem;
  // nothing is left behind and the record says why.
  write_policy("0");
  r = BargeJson("run --force --source big --policy " + Q(policy), cat);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const json& b2 = SourceOf(r.result, "big");
  EXPECT_EQ(b2.at("result"), "failed");
  EXPECT_NE(b2.at("error").get<std::string>().find("NoSpace"), std::string::npos) << b2.dump();
  EXPECT_NE(b2.at("error").get<std::string>().find("the target needs up to"), std::string::npos) << b2.dump();
  EXPECT_EQ(Manifests(target + "/full/big"), 0u);
  EXPECT_TRUE(Leftovers(target).empty());
  CliResult runs = BargeJson("runs list --policy full --source big", cat);
  ASSERT_EQ(runs.result.at("runs").size(), 2u);
  EXPECT_EQ(runs.result.at("runs")[0].at("result"), "failed");
}

// Issue 18: a failed backup never costs a restore point. Two sources with
// retention_count 2 and two points each: an image removed, an NBD export
// whose reads fail, then a full target; each run fails and every point
// stays. A later successful backup applies retention after its new point:
// 2 points remain, the new one among them.
TEST(PolicyCliTest, FailedBackupNeverCostsARestorePoint) {
  BARGE_REQUIRE_TOOL("nbdkit");
  TempDir dir;
  const std::string disk = dir / "d.raw", cat = dir / "catalog.db", broken = dir / "reads-fail";
  const std::string sock = dir / "n.sock";
  testing::SocketServer nbd("nbdkit -f -U " + Q(sock) + " --filter=error pattern 2M error-pread=EIO "
                            "error-pread-rate=1 error-pread-file=" + Q(broken), sock);
  ASSERT_TRUE(nbd.WaitReady());
  testing::WriteFile(disk, testing::RandomBytes(1 << 20, 11));
  TmpfsMount tmpfs(dir / "t", "16m");
  fs::create_directories(dir / "t");
  const std::string policy = dir / "p.yaml";
  WriteText(policy, "name: keep\nsources:\n  - image: " + disk + "\n    name: d\n  - nbd: " + nbd.uri() +
                        "\n    name: n\nretention_count: 2\ntargets: [" + (dir / "t") +
                        "]\nfree_space_multiple: 1\n");
  const std::string run = "run --force --policy " + Q(policy);
  for (int i = 0; i < 2; ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // ids tell time to the second
    CliResult r = BargeJson(run, cat);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string d_chain = dir / "t/keep/d", n_chain = dir / "t/keep/n";
  ASSERT_EQ(Manifests(d_chain), 2u);
  ASSERT_EQ(Manifests(n_chain), 2u);
  auto expect_kept = [&](const CliResult& r, const std::string& code) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const char* s : {"d", "n"}) {
      const json& src = SourceOf(r.result, s);
      EXPECT_EQ(src.at("result"), "failed") << src.dump();
      EXPECT_EQ(src.at("retention"), "") << src.dump();
    }
    EXPECT_EQ(Manifests(d_chain), 2u) << r.output;
    EXPECT_EQ(Manifests(n_chain), 2u) << r.output;
    EXPECT_NE(SourceOf(r.result, "d").at("error").get<std::string>().find(code), std::string::npos) << r.output;
  };

  // The disk moved away; the export's reads fail.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  fs::rename(disk, dir / "moved.raw");
  WriteText(broken, "");
  CliResult gone = BargeJson(run, cat);
  expect_kept(gone, "NotFound");
  EXPECT_NE(SourceOf(gone.result, "n").at("error").get<std::string>().find("IoError"), std::string::npos)
      << gone.output;

  // Back and readable, but the target is full.
  fs::rename(dir / "moved.raw", disk);
  fs::remove(broken);
  if (tmpfs.mounted()) {
    FillUpTo(dir / "t/filler", 256 << 10);
    CliResult full = BargeJson(run, cat);
    expect_kept(full, "NoSpace");
    fs::remove(dir / "t/filler");
  }

  // A backup that succeeds: the new point is kept, the oldest goes.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  CliResult ok = BargeJson(run + " --source d", cat);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(SourceOf(ok.result, "d").at("retention"), "1 point(s) removed");
  const std::string newest = SourceOf(ok.result, "d").at("points")[0].at("id");
  EXPECT_EQ(Manifests(d_chain), 2u);
  EXPECT_TRUE(fs::exists(d_chain + "/" + newest + ".json"));
  EXPECT_EQ(Manifests(n_chain), 2u);
  if (!tmpfs.mounted()) GTEST_SKIP() << "tmpfs not mounted (needs root): the full target not checked";
}

// Issue 18: a missing target fails the source with NotFound (not
// NoSpace), and is not created; a read-only one never qualifies and is
// down in the metrics.
TEST(PolicyCliTest, MissingOrReadOnlyTarget) {
  TempDir dir;
  const std::string cat = dir / "catalog.db", policy = dir / "p.yaml";
  testing::WriteFile(dir / "a.raw", testing::RandomBytes(1 << 20, 31));
  WriteText(policy, "name: tg\nsources:\n  - image: " + (dir / "a.raw") + "\ntargets: [" + (dir / "nowhere") +
                        "]\nfree_space_multiple: 0\n");
  CliResult r = BargeJson("run --force --policy " + Q(policy), cat);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string error = SourceOf(r.result, "a").at("error");
  EXPECT_EQ(error.rfind("NotFound: no target can be used; " + (dir / "nowhere") + ": NotFound", 0), 0u) << error;
  EXPECT_FALSE(fs::exists(dir / "nowhere"));  // a missing target is never created

  TmpfsMount ro(dir / "ro", "1m", MS_RDONLY);
  if (!ro.mounted()) GTEST_SKIP() << "tmpfs not mounted (needs root)";
  WriteText(policy, "name: tg\nsources:\n  - image: " + (dir / "a.raw") + "\ntargets: [" + (dir / "ro") +
                        "]\nfree_space_multiple: 0\n");
  r = BargeJson("run --force --policy " + Q(policy) + " --metrics-textfile " + Q(dir / "m.prom"), cat);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(SourceOf(r.result, "a").at("error"),
            "IoError: no target can be used; " + (dir / "ro") + ": IoError: " + (dir / "ro") +
                ": the filesystem is mounted read-only")
      << r.output;
  const std::string prom = Slurp(dir / "m.prom");
  EXPECT_NE(prom.find("barge_policy_target_up{policy=\"tg\",target=\"" + (dir / "ro") + "\"} 0"), std::string::npos)
      << prom;
}

// Issue 18: after a failed slot, the next `run` retries the source (not
// "not due" until the next slot); after a success it waits again.
TEST(PolicyCliTest, FailedSourceIsRetriedAtTheNextRun) {
  TempDir dir;
  const std::string cat = dir / "catalog.db", policy = dir / "p.yaml", disk = dir / "d.raw";
  fs::create_directories(dir / "t");
  WriteText(policy, "name: retry\nsources:\n  - image: " + disk + "\nschedule: '0 2 * * *'\ntargets: [" +
                        (dir / "t") + "]\nfree_space_multiple: 0\n");
  CliResult r1 = BargeJson("run --policy " + Q(policy), cat);  // never backed up: due; the disk is missing
  EXPECT_EQ(r1.exit_code, 1) << r1.output;
  EXPECT_EQ(SourceOf(r1.result, "d").at("result"), "failed");
  testing::WriteFile(disk, testing::RandomBytes(1 << 20, 41));
  CliResult r2 = BargeJson("run --policy " + Q(policy), cat);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  const json& d = SourceOf(r2.result, "d");
  EXPECT_EQ(d.at("result"), "success") << d.dump();
  EXPECT_EQ(d.at("trigger"), "schedule");
  EXPECT_EQ(d.at("due_reason").get<std::string>().rfind("retry: the last backup (", 0), 0u) << d.dump();
  CliResult r3 = BargeJson("run --policy " + Q(policy), cat);
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  EXPECT_EQ(SourceOf(r3.result, "d").at("result"), "not_due") << r3.output;
}

// Issue 18 (README, docs/policies.md "Raw disks with change tracking"):
// a raw disk's CBT route in a policy. A CBT overlay over the raw file, the
// overlay as the image source with its bitmap: a full, then an
// incremental holding only the writes through the overlay; the newest
// point restores to the raw disk's bytes. The free-space rule counts the
// raw file's allocation.
TEST(PolicyCliTest, RawDiskThroughACbtOverlay) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir dir;
  const std::string raw = dir / "disk.raw", overlay = dir / "disk.qcow2", cat = dir / "catalog.db";
  RunOk("truncate -s 16M " + Q(raw) + " && qemu-io -f raw -c 'write -P 0x5a 0 6M' " + Q(raw) + " >/dev/null");
  RunOk(Barge() + " overlay create --data-file " + Q(raw) + " " + Q(overlay) + " --bitmap cbt0");
  TmpfsMount tmpfs(dir / "t", "24m");
  fs::create_directories(dir / "t");
  const std::string policy = dir / "p.yaml";
  auto write_policy = [&](const std::string& multiple) {
    WriteText(policy, "name: cbt\nsources:\n  - image: " + overlay + "\n    bitmap: cbt0\n    name: disk\ntargets: [" +
                          (dir / "t") + "]\nfree_space_multiple: " + multiple + "\n");
  };
  if (tmpfs.mounted()) {
    // 5 x the raw file's 6 MiB of data exceed the 24 MiB target (the
    // overlay file alone is a few hundred KiB).
    write_policy("5");
    CliResult big = BargeJson("run --force --policy " + Q(policy), cat);
    ASSERT_EQ(big.exit_code, 1) << big.output;
    const std::string need = SourceOf(big.result, "disk").at("error");
    const size_t paren = need.find(" bytes free (");
    ASSERT_NE(paren, std::string::npos) << need;
    EXPECT_GE(std::stoull(need.substr(paren + 13)), 6ull << 20) << need;  // the raw file's data counts
  }

  write_policy("1");
  CliResult full = BargeJson("run --force --policy " + Q(policy), cat);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_EQ(SourceOf(full.result, "disk").at("type"), "full");
  RunOk("qemu-io -f qcow2 -c 'write -P 0x77 8M 64k' " + Q(overlay) + " >/dev/null");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  CliResult inc = BargeJson("run --force --policy " + Q(policy), cat);
  ASSERT_EQ(inc.exit_code, 0) << inc.output;
  const json& d = SourceOf(inc.result, "disk");
  EXPECT_EQ(d.at("type"), "incremental") << d.dump();
  EXPECT_LE(d.at("bytes_read").get<uint64_t>(), 1u << 20) << d.dump();
  const std::string chain = d.at("points")[0].at("chain_dir");
  const std::string id = d.at("points")[0].at("id");
  CliResult rr = BargeJson("restore " + Q(chain) + " --at " + Q(id) + " --to " + Q(dir / "restored.raw") +
                           " --no-sync", cat);
  ASSERT_EQ(rr.exit_code, 0) << rr.output;
  RunOk("qemu-img compare -q -f raw -F raw " + Q(dir / "restored.raw") + " " + Q(raw));
}

// A policy image whose state folder `barge state migrate` moved (the
// policy file then names the new path) continues its chain with an
// incremental, as `barge backup` does: the runner took the moved disk for
// another disk and started a new chain, and its backup did not look for
// the move.
TEST(PolicyCliTest, ImageMovedByStateMigrateKeepsItsChain) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir tmp;
  const std::string dir = fs::canonical(tmp.path()).string();
  const std::string old_dir = dir + "/pvc-old/state", new_dir = dir + "/pvc-new/state", cat = dir + "/catalog.db";
  fs::create_directories(old_dir);
  fs::create_directories(dir + "/pvc-new");
  fs::create_directories(dir + "/t");
  RunOk("qemu-img create -q -f qcow2 " + Q(old_dir + "/disk.qcow2") + " 8M && qemu-io -f qcow2 -c 'write -P 0x31 0 2M' " +
        Q(old_dir + "/disk.qcow2") + " >/dev/null && qemu-img bitmap --add --enable " + Q(old_dir + "/disk.qcow2") +
        " cbt0");
  const std::string policy = dir + "/p.yaml";
  auto write_policy = [&](const std::string& image) {
    WriteText(policy, "name: moved\nsources:\n  - image: " + image + "\n    bitmap: cbt0\n    name: disk\ntargets: [" +
                          dir + "/t]\nfree_space_multiple: 0\n");
  };
  write_policy(old_dir + "/disk.qcow2");
  CliResult full = BargeJson("run --force --policy " + Q(policy), cat);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_EQ(SourceOf(full.result, "disk").at("type"), "full");

  RunOk("qemu-io -f qcow2 -c 'write -P 0x32 1M 64k' " + Q(old_dir + "/disk.qcow2") + " >/dev/null");
  RunOk(Barge() + " state migrate --no-libvirt --from " + Q(old_dir) + " --to " + Q(new_dir));
  write_policy(new_dir + "/disk.qcow2");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  CliResult inc = BargeJson("run --force --policy " + Q(policy), cat);
  ASSERT_EQ(inc.exit_code, 0) << inc.output;
  const json& d = SourceOf(inc.result, "disk");
  EXPECT_EQ(d.at("type"), "incremental") << d.dump();
  const std::string chain = d.at("points")[0].at("chain_dir");
  EXPECT_EQ(chain, SourceOf(full.result, "disk").at("points")[0].at("chain_dir"));
  const json m = json::parse(RunOk("cat " + Q(chain) + "/0001-*.json"));
  EXPECT_EQ(m["disk_identity"]["location"], new_dir + "/disk.qcow2") << m.dump();
  EXPECT_EQ(m["disk_identity"]["moved_from"], old_dir + "/disk.qcow2") << m.dump();
  RunOk(Barge() + " verify --all " + Q(chain));
  CliResult rr = BargeJson("restore " + Q(chain) + " --to " + Q(dir + "/restored.raw") + " --no-sync", cat);
  ASSERT_EQ(rr.exit_code, 0) << rr.output;
  RunOk("qemu-img compare -q -U -f raw -F qcow2 " + Q(dir + "/restored.raw") + " " + Q(new_dir + "/disk.qcow2"));
}

// Issue 18: a first policy backup that fails (reads fail; or stopped)
// leaves no folder behind in the target, as a plain `barge backup` does.
TEST(PolicyCliTest, FailedFirstBackupLeavesNoFolder) {
  BARGE_REQUIRE_TOOL("nbdkit");
  TempDir dir;
  const std::string sock = dir / "n.sock", cat = dir / "catalog.db";
  testing::SocketServer nbd("nbdkit -f -U " + Q(sock) + " --filter=error pattern 2M error-pread=EIO "
                            "error-pread-rate=1", sock);
  ASSERT_TRUE(nbd.WaitReady());
  fs::create_directories(dir / "t");
  const std::string policy = dir / "p.yaml";
  WriteText(policy, "name: first\nsources:\n  - nbd: " + nbd.uri() + "\n    name: n\ntargets: [" + (dir / "t") +
                        "]\nfree_space_multiple: 0\n");
  CliResult r = BargeJson("run --force --policy " + Q(policy), cat);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(SourceOf(r.result, "n").at("result"), "failed");
  EXPECT_TRUE(fs::is_empty(dir / "t")) << fs::directory_iterator(dir / "t")->path();
}

TEST(PolicyCliTest, RunStoppedPastMaxRunTimeOrBySigtermLeavesNothing) {
  BARGE_REQUIRE_TOOL("nbdkit");
  TempDir dir;
  const std::string sock = dir / "slow.sock", cat = dir / "catalog.db";
  // 200 ms per read: a 256 MiB export takes minutes.
  testing::SocketServer slow("nbdkit -f -U " + Q(sock) + " --filter=delay pattern 256M rdelay=200ms", sock);
  ASSERT_TRUE(slow.WaitReady());
  testing::WriteFile(dir / "quick.raw", testing::RandomBytes(1 << 20, 4));
  fs::create_directories(dir / "t");
  const std::string policy = dir / "p.yaml";
  WriteText(policy, "name: stop\nsources:\n  - nbd: " + slow.uri() + "\n    name: slow\n  - image: " +
                        (dir / "quick.raw") + "\nmax_parallel: 2\nmax_run_time: 3s\ntargets: [" + (dir / "t") +
                        "]\nfree_space_multiple: 0\n");
  const auto t0 = std::chrono::steady_clock::now();
  CliResult r = BargeJson("run --force --policy " + Q(policy), cat);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.result.at("stopped"), true);
  EXPECT_EQ(r.result.at("stop_reason"), "stopped: max_run_time 3s exceeded");
  const json& s = SourceOf(r.result, "slow");
  EXPECT_EQ(s.at("result"), "failed");
  EXPECT_EQ(s.at("error").get<std::string>().rfind("stopped: max_run_time 3s exceeded", 0), 0u) << s.dump();
  EXPECT_EQ(SourceOf(r.result, "quick").at("result"), "success");
  EXPECT_EQ(Manifests(dir / "t/stop/slow"), 0u);
  EXPECT_TRUE(Leftovers(dir / "t").empty());

  // SIGTERM: the run stops the same way, recorded "stopped by SIGTERM";
  // barge exits 143.
  Background run(Barge() + " run --force --source slow --json --policy " + Q(policy), dir / "out", dir / "err",
                 {{"BARGE_CATALOG", cat}});
  // Wait until its record says running, then stop it.
  ASSERT_TRUE(WaitFor([&] {
    auto l = testing::Run("BARGE_CATALOG=" + Q(cat) + " " + Barge() + " runs list --limit 1 --json");
    if (l.exit_code != 0) return false;  // no catalog yet
    json res = testing::ResultOf(l.stdout_text);
    return res.contains("runs") && !res["runs"].empty() && res["runs"][0]["result"] == "running";
  }, std::chrono::seconds(20)));
  run.Signal(SIGTERM);
  EXPECT_EQ(run.Wait(std::chrono::seconds(30)), 143) << run.err();
  json result = testing::ResultOf(run.out());
  ASSERT_FALSE(result.empty()) << run.out() << run.err();
  EXPECT_EQ(testing::ErrorOf(run.out()).value("exit_code", -1), 143) << run.out();
  EXPECT_EQ(SourceOf(result, "slow").at("error").get<std::string>().rfind("stopped by SIGTERM", 0), 0u)
      << result.dump();
  CliResult runs = BargeJson("runs list --policy stop --source slow --limit 1", cat);
  EXPECT_EQ(runs.result.at("runs")[0].at("result"), "failed");
  EXPECT_EQ(Manifests(dir / "t/stop/slow"), 0u);
  EXPECT_TRUE(Leftovers(dir / "t").empty());
}

TEST(PolicyCliTest, ForgetKeepsEveryRemainingPointRestorable) {
  TempDir dir;
  const std::string cat = dir / "catalog.db";
  testing::WriteFile(dir / "d.raw", testing::RandomBytes(1 << 20, 5));
  fs::create_directories(dir / "t");
  const std::string policy = dir / "p.yaml";
  WriteText(policy, "name: fg\nsources:\n  - image: " + (dir / "d.raw") + "\nretention_count: 10\ntargets: [" +
                        (dir / "t") + "]\nfree_space_multiple: 0\n");
  for (int i = 0; i < 3; ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    ASSERT_EQ(BargeJson("run --force --policy " + Q(policy), cat).exit_code, 0);
  }
  CliResult dry = BargeJson("forget --policy " + Q(policy) + " --keep-last 1 --dry-run", cat);
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_EQ(dry.result.at("dry_run"), true);
  EXPECT_EQ(dry.result.at("forgotten"), 2);
  EXPECT_EQ(Manifests(dir / "t"), 3u);
  CliResult done = BargeJson("forget --policy " + Q(policy) + " --keep-last 1", cat);
  ASSERT_EQ(done.exit_code, 0) << done.output;
  EXPECT_EQ(done.result.at("sources")[0].at("kept").size(), 1u);
  EXPECT_EQ(Manifests(dir / "t"), 1u);
  // Every count 0 is refused (it would forget everything).
  EXPECT_EQ(BargeJson("forget --policy " + Q(policy), cat).exit_code, 64);
  EXPECT_EQ(BargeJson("run --policy " + Q(policy) + " --source nope", cat).exit_code, 64);
}

// Issue 23 §2: a point another chain stands on (`backup --base`) is kept
// by the policy's retention, whatever retention_count says, and said so;
// the dependent chain still verifies and restores through it.
TEST(PolicyCliTest, RetentionKeepsABasePointAndSaysWhy) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  const std::string cat = dir / "catalog.db";
  std::vector<std::byte> bytes = testing::RandomBytes(1 << 20, 7);
  testing::WriteFile(dir / "d.raw", bytes);
  fs::create_directories(dir / "t");
  const std::string policy = dir / "p.yaml";
  WriteText(policy, "name: rb\nsources:\n  - image: " + (dir / "d.raw") + "\nretention_count: 1\ntargets: [" +
                        (dir / "t") + "]\nfree_space_multiple: 0\n");
  ASSERT_EQ(BargeJson("run --force --policy " + Q(policy), cat).exit_code, 0);
  std::string chain;
  for (const auto& e : fs::recursive_directory_iterator(dir / "t")) {
    if (e.path().extension() == ".qcow2") chain = e.path().parent_path().string();
  }
  ASSERT_FALSE(chain.empty());
  const std::vector<std::string> first = testing::PointIds(chain);
  ASSERT_EQ(first.size(), 1u);
  // A clone of the disk, backed up over the policy's point.
  std::vector<std::byte> clone = bytes;
  std::fill(clone.begin() + (256 << 10), clone.begin() + (320 << 10), std::byte{0x5a});
  testing::WriteFile(dir / "clone.raw", clone);
  RunOk(Barge() + " backup --source " + Q(dir / "clone.raw") + " --source-format raw --target " + Q(dir / "c") +
        " --name clone --base " + Q(chain));
  // The disk changes; two more runs, retention_count 1.
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    bytes[static_cast<size_t>(i) * 65536 + 3] ^= std::byte{0xff};
    testing::WriteFile(dir / "d.raw", bytes);
    CliResult r = BargeJson("run --force --policy " + Q(policy), cat);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::vector<std::string> now = testing::PointIds(chain);
  EXPECT_NE(std::find(now.begin(), now.end(), first[0]), now.end()) << "the base point went";
  CliResult dry = BargeJson("forget --policy " + Q(policy) + " --keep-last 1 --dry-run", cat);
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.result.dump().find("base of 1 chain"), std::string::npos) << dry.result.dump(2);
  RunOk(Barge() + " verify " + Q(dir / "c/clone"));
  RunOk(Barge() + " restore " + Q(dir / "c/clone") + " --to " + Q(dir / "r.raw") + " --no-sync");
  EXPECT_EQ(testing::ReadFile(dir / "r.raw"), clone);
}

}  // namespace
}  // namespace barge
