// One planner for vm backup (issue 37 §2): `doctor`'s forecast, `vm backup
// --dry-run` and `vm backup` itself ask the same function what happens to
// each disk (full, incremental, resume, and why). Each test puts a domain
// into a killed or failed state, takes the forecast (dry run, text and
// --json, and doctor with the target), checks that the dry run changed
// nothing, then runs the backup and compares it with the forecast.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "orchestrate/vm/vm_backup.h"
#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Holds a vm backup at the point every disk was read and its points
// written, nothing committed (VmBackupFaults::Point::kAfterRead), by
// reporting its whole work done through `progress` (HeldVmBackup then
// holds it until it is killed).
class HoldAfterRead final : public orchestrate::VmBackupFaults {
 public:
  explicit HoldAfterRead(HeldVmBackup::ProgressFn progress) : progress_(std::move(progress)) {}
  Status At(Point point) override {
    if (point == Point::kAfterRead) progress_(1, 1);
    return OkStatus();
  }

 private:
  HeldVmBackup::ProgressFn progress_;
};

class VmPlanTest : public VmTestBase {
 protected:
  // Defines `dom` (its disk made by MakeQcow2("d.qcow2")), starts it
  // paused, makes tracker t1 and writes 8 MiB.
  void Prepare(TestDomain& dom) {
    dom.Define(dir_.path().string());
    dom.StartPaused();
    RunOk(Barge("tracker create t1 --domain " + dom.name()));
    dom.Write(0x11, "0", "8M");
    dom.Flush();
  }
  // What could change: libvirt's checkpoints, every file in the target and
  // the catalog's folder (name, size, modification time; the catalog's own
  // files, which a reader's sqlite may touch, by their records).
  std::string State(const std::string& domain) {
    std::string out = "checkpoints:\n" + Checkpoints(domain);
    std::map<std::string, std::string> files;
    std::vector<fs::directory_entry> entries;
    for (const std::string& root : {std::string(target_), std::string(dir_ / "state")}) {
      for (const auto& e : fs::recursive_directory_iterator(root)) {
        if (e.path().filename().string().rfind("catalog.db", 0) != 0) entries.push_back(e);
      }
    }
    for (const auto& e : entries) {
      struct stat st {};
      if (::lstat(e.path().c_str(), &st) != 0) continue;
      files[e.path().string()] = std::to_string(st.st_size) + "@" + std::to_string(st.st_mtim.tv_sec) + "." +
                                 std::to_string(st.st_mtim.tv_nsec);
    }
    for (const auto& [p, s] : files) out += p + " " + s + "\n";
    return out + BargeJson("vm backups --domain " + domain)["backups"].dump();
  }
  // `vm backup --dry-run` (--json and text) with `extra`, checked to change
  // nothing; doctor's forecast with the target agrees with it. Returns the
  // dry run's result.
  json DryRun(const std::string& domain, const std::string& extra = "") {
    const std::string before = State(domain);
    const std::string args = "vm backup --domain " + domain + " --target " + ShellQuote(target_) +
                             " --skip-quiesce --dry-run " + extra;
    json plan = BargeJson(args);
    EXPECT_EQ(plan["dry_run"], true) << plan.dump();
    EXPECT_EQ(plan["refusal"], "") << plan.dump();
    const std::string text = RunOk(Barge(args));
    for (const auto& d : plan["disks"]) {
      const std::string line = "  " + d["disk"].get<std::string>() + ": " + d["backup_type"].get<std::string>() +
                               " (" + d["reason"].get<std::string>() + ")";
      EXPECT_NE(text.find(line), std::string::npos) << text;
    }
    EXPECT_EQ(State(domain), before) << "the dry run changed something";
    if (extra.empty()) ExpectDoctorAgrees(domain, plan);
    return plan;
  }
  // doctor --target forecasts what `plan` says, disk by disk, the data a
  // killed run staged included (--json and text).
  void ExpectDoctorAgrees(const std::string& domain, const json& plan) {
    const std::string args = "doctor --domain " + domain + " --target " + ShellQuote(target_);
    json doc = BargeJson(args);
    const std::string text = RunOk(Barge(args));
    ASSERT_EQ(doc["next_backup"].size(), plan["disks"].size()) << doc.dump() << plan.dump();
    for (size_t i = 0; i < plan["disks"].size(); ++i) {
      const json& p = plan["disks"][i];
      for (const char* k : {"backup_type", "reason", "staged", "resume_from", "resume_refused"}) {
        EXPECT_EQ(doc["next_backup"][i][k], p[k]) << k << ": " << doc.dump();
      }
      if (p["staged"] == "resume") {
        const std::string line = "resumes the data staged by an interrupted run (checkpoint " +
                                 p["resume_from"].get<std::string>() + ")";
        EXPECT_NE(text.find(line), std::string::npos) << text;
      }
    }
  }
  // The run `b` did per disk what `plan` said.
  static void ExpectRunAsPlanned(const json& plan, const json& b) {
    ASSERT_EQ(b["disks"].size(), plan["disks"].size()) << b.dump() << plan.dump();
    EXPECT_EQ(b["mode"], plan["mode"]) << b.dump();
    EXPECT_EQ(b["tracker"], plan["tracker"]) << b.dump();
    for (size_t i = 0; i < plan["disks"].size(); ++i) {
      const json& p = plan["disks"][i];
      const json& d = b["disks"][i];
      EXPECT_EQ(d["disk"], p["disk"]);
      EXPECT_EQ(d["backup_type"], p["backup_type"]) << b.dump() << "\n" << plan.dump();
      EXPECT_EQ(d["reason"], p["reason"]) << b.dump() << "\n" << plan.dump();
      if (p["staged"] == "") {
        EXPECT_FALSE(d.contains("resume")) << b.dump() << "\n" << plan.dump();
      } else {
        ASSERT_TRUE(d.contains("resume")) << b.dump() << "\n" << plan.dump();
        EXPECT_EQ(d["resume"]["resumed"], p["staged"] == "resume") << b.dump() << "\n" << plan.dump();
        if (p["staged"] == "start over") {
          EXPECT_EQ(d["resume"]["problem"], p["resume_refused"]) << b.dump();
        }
      }
    }
  }
  json Run(const std::string& domain, const std::string& extra = "") { return Backup(domain, extra); }
  // Writes 48 MiB of `byte` from 8 MiB on, then runs a vm backup of `dom`
  // in a child, slowed down, and SIGKILLs it halfway through its copy.
  void WriteAndKillMidCopy(TestDomain& dom, int byte) {
    dom.Write(byte, "8M", "48M");
    dom.Flush();
    orchestrate::VmBackupRequest req = VmRequest(dom.name(), target_);
    req.copy.chunk_bytes = 1 << 20;
    HeldVmBackup run(req, 1, 2);
    ASSERT_TRUE(run.WaitHeld(std::chrono::milliseconds(2500))) << "the run never copied half of its work";
    run.Kill();
  }
};

// Issue 37: after an incremental killed once its points were written (all
// disks read, nothing committed), doctor forecast a full ("chain does not
// end at checkpoint ...": the killed run's uncommitted point) where vm
// backup, which removes that point first, makes an incremental.
TEST_F(VmPlanTest, ForecastAfterAKilledIncrementalWithItsPointWritten) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TestDomain dom("plan-killed-written", {{"vda", MakeQcow2("d.qcow2"), "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom));
  json b0 = Run(dom.name());
  ASSERT_EQ(b0["backup_type"], "full") << b0.dump();
  dom.Write(0x22, "1M", "1M");
  dom.Flush();
  {
    orchestrate::VmBackupRequest req = VmRequest(dom.name(), target_);
    HeldVmBackup run(
        [req](HeldVmBackup::ProgressFn progress) mutable {
          HoldAfterRead hold(progress);
          req.faults = &hold;
          auto r = orchestrate::RunVmBackup(Env::Default(), req);
          return r.ok() ? std::string() : r.error().ToString();
        },
        1, 1);
    ASSERT_TRUE(run.WaitHeld()) << "the run never read its disks";
    run.Kill();
  }
  json doc = BargeJson("doctor --domain " + dom.name() + " --target " + ShellQuote(target_));
  ASSERT_EQ(doc["next_backup"].size(), 1u) << doc.dump();
  EXPECT_EQ(doc["next_backup"][0]["backup_type"], "incremental") << doc.dump();

  json plan = DryRun(dom.name());
  json b1 = Run(dom.name());
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  ExpectRunAsPlanned(plan, b1);
}

// A failed run (fault after the reads), a killed one (mid-copy: a resume),
// a killed one again with --no-resume (starts over), --force-full: each
// time the dry run says what the run then does.
TEST_F(VmPlanTest, DryRunMatchesTheRunAfterFailedAndKilledRuns) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TestDomain dom("plan-states", {{"vda", MakeQcow2("d.qcow2"), "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom));
  // No backup yet.
  json plan = DryRun(dom.name());
  json b0 = Run(dom.name());
  ExpectRunAsPlanned(plan, b0);

  // Failed after reading every disk: undone, the next is incremental.
  dom.Write(0x22, "1M", "1M");
  dom.Flush();
  const std::string failed =
      VmBackupFailingAt(orchestrate::VmBackupFaults::Point::kAfterRead, dom.name(), target_, true);
  EXPECT_NE(failed.find("injected fault"), std::string::npos) << failed;
  plan = DryRun(dom.name());
  EXPECT_EQ(plan["disks"][0]["backup_type"], "incremental") << plan.dump();
  ExpectRunAsPlanned(plan, Run(dom.name()));

  // Killed mid-copy: the next run resumes what it staged.
  ASSERT_NO_FATAL_FAILURE(WriteAndKillMidCopy(dom, 0x33));
  plan = DryRun(dom.name());
  EXPECT_EQ(plan["disks"][0]["staged"], "resume") << plan.dump();
  ExpectRunAsPlanned(plan, Run(dom.name()));

  // Killed again; --no-resume: the dry run says it starts over, and why.
  ASSERT_NO_FATAL_FAILURE(WriteAndKillMidCopy(dom, 0x44));
  plan = DryRun(dom.name(), "--no-resume");
  EXPECT_EQ(plan["disks"][0]["staged"], "start over") << plan.dump();
  EXPECT_EQ(plan["disks"][0]["resume_refused"], "resuming is off") << plan.dump();
  ExpectRunAsPlanned(plan, Run(dom.name(), "--no-resume"));

  plan = DryRun(dom.name(), "--force-full");
  EXPECT_EQ(plan["disks"][0]["reason"], "--force-full") << plan.dump();
  ExpectRunAsPlanned(plan, Run(dom.name(), "--force-full"));
}

// A dry run the plan refuses (a target that is a file) exits as the run
// would, with the same error, after its result: never 0.
TEST_F(VmPlanTest, RefusedDryRunExitsAsTheRunWould) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TestDomain dom("plan-refused", {{"vda", MakeQcow2("d.qcow2"), "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom));
  const std::string file = dir_ / "a-file";
  WriteFile(file, RandomBytes(16, 1));
  const std::string args = "vm backup --domain " + dom.name() + " --target " + ShellQuote(file) + " --skip-quiesce";
  const CommandResult run = testing::Run(Barge(args));
  ASSERT_NE(run.exit_code, 0) << run.output;
  const CommandResult dry = testing::Run(Barge(args + " --dry-run"));
  EXPECT_EQ(dry.exit_code, run.exit_code) << dry.output;
  EXPECT_NE(dry.output.find(" (dry run): refused: InvalidArgument: "), std::string::npos) << dry.output;
  json plan = RunResult(Barge(args + " --dry-run --json"), run.exit_code);
  EXPECT_NE(plan["refusal"], "") << plan.dump();
  json e = RunError(Barge(args + " --dry-run --json"), run.exit_code);
  json real = RunError(Barge(args + " --json"), run.exit_code);
  EXPECT_EQ(e["code"], real["code"]) << e.dump() << real.dump();
  EXPECT_TRUE(fs::is_regular_file(file));
}

}  // namespace
}  // namespace barge::testing
