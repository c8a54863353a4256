// The files in deploy/: the Prometheus example configuration (with the
// shipped rules) passes `promtool check config`, and the systemd units pass
// `systemd-analyze verify` (works on Debian 12 without systemd running; the
// units' /usr/local/bin/barge is pointed at the built binary, since verify
// checks that ExecStart is executable). The Kubernetes manifests are checked
// offline (no API server can run here) by tests/deploy_kubernetes_check.py:
// the kustomization rendered (and compared with `kubectl kustomize` where
// kubectl is installed), every field against the API's, the Pod Security
// level the namespace enforces, per-index retries, no Secret shipped; it
// must also catch broken copies of them, and the CronJob's worker
// command line is run with the built barge as each pod would run it; the
// Containerfile's runtime packages must cover the built binary's
// libraries. The Slurm array script runs for real in
// tests/slurm_fleet_test.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;

using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;

const std::string kDeploy = std::string(BARGE_SOURCE_DIR) + "/deploy";

TEST(DeployTest, PrometheusExampleConfigAndRules) {
  BARGE_REQUIRE_TOOL("promtool");
  std::string out = RunOk("promtool check config " + ShellQuote(kDeploy + "/prometheus/prometheus.yml"));
  EXPECT_NE(out.find("SUCCESS: 4 rules found"), std::string::npos) << out;
}

TEST(DeployTest, SystemdUnitsVerify) {
  BARGE_REQUIRE_TOOL("systemd-analyze");
  TempDir dir;
  for (const char* unit : {"barge-serve@.service", "barge-run@.service", "barge-run@.timer",
                           "barge-agent@.service", "barge-agent@.timer"}) {
    std::ifstream in(kDeploy + "/systemd/" + unit);
    std::stringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    ASSERT_FALSE(s.empty()) << unit;
    for (size_t at; (at = s.find("/usr/local/bin/barge")) != std::string::npos;) {
      s.replace(at, std::string("/usr/local/bin/barge").size(), testing::BargeBinary());
    }
    std::ofstream(dir / unit) << s;
  }
  // Instances, as systemctl would load them; every warning is a failure.
  auto r = testing::Run("cd " + ShellQuote(dir.path().string()) +
               " && SYSTEMD_LOG_LEVEL=warning systemd-analyze verify ./barge-serve@nightly.service "
               "./barge-run@nightly.service ./barge-run@nightly.timer "
               "./barge-agent@nightly.service ./barge-agent@nightly.timer");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_EQ(line.find("barge-"), std::string::npos) << line;
  }
  // What the units promise.
  std::string serve = RunOk("cat " + ShellQuote(kDeploy + "/systemd/barge-serve@.service"));
  for (const char* want : {"Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "SuccessExitStatus=143",
                           "--policy /etc/barge/%i.yaml", "--listen ${BARGE_LISTEN}"}) {
    EXPECT_NE(serve.find(want), std::string::npos) << want;
  }
  EXPECT_EQ(serve.find("\nPrivateTmp=yes"), std::string::npos) << "libvirt's NBD socket is in the real /tmp";
  std::string agent = RunOk("cat " + ShellQuote(kDeploy + "/systemd/barge-agent@.service"));
  for (const char* want : {"--shard ${BARGE_SHARD}", "--catalog ${BARGE_RECORDS}", "EnvironmentFile=/etc/barge/%i.agent.env",
                           "Restart=on-failure", "RestartPreventExitStatus=64", "StartLimitBurst="}) {
    EXPECT_NE(agent.find(want), std::string::npos) << want;
  }
}

// Runs the offline checker on `dir`; returns its exit code and output.
testing::CommandResult CheckKubernetes(const std::string& dir) {
  return testing::Run("python3 " + ShellQuote(std::string(BARGE_SOURCE_DIR) + "/tests/deploy_kubernetes_check.py") +
                      " " + ShellQuote(dir) + " " + ShellQuote(testing::BargeBinary()));
}

TEST(DeployTest, KubernetesManifestsOffline) {
  BARGE_REQUIRE_TOOL("python3");
  if (testing::Run("python3 -c 'import yaml'").exit_code != 0) {
    if (testing::ToolsRequired()) FAIL() << "python3-yaml missing";
    GTEST_SKIP() << "python3-yaml missing";
  }
  const std::string shipped = kDeploy + "/kubernetes";
  auto r = CheckKubernetes(shipped);
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // The checker must catch what it claims to: broken copies, one fault each.
  struct Fault {
    const char* file;
    const char* from;
    const char* to;
    const char* expect;  // in the checker's output
  };
  const Fault faults[] = {
      {"barge-cronjob.yaml", "completions: 3", "completions: 4", "differs from completions 4"},
      {"barge-cronjob.yaml", "value: \"3\"", "value: \"2\"", "shard count ('2'"},
      {"barge-cronjob.yaml", "completionMode: Indexed", "completionmode: Indexed", "unknown field 'completionmode'"},
      {"barge-cronjob.yaml", "concurrencyPolicy: Forbid", "concurrencyPolicy: Allow", "concurrencyPolicy must be Forbid"},
      {"barge-cronjob.yaml", "defaultMode: 0400", "defaultMode: 0440", "defaultMode must be 0400"},
      {"barge-cronjob.yaml", "restartPolicy: Never", "restartPolicy: OnFailure", "restartPolicy must be Never"},
      {"barge-cronjob.yaml", "                - auto", "                - 0/3", "--shard auto"},
      {"barge-cronjob.yaml", "subPath: nightly.yaml", "subPath: daily.yaml", "no key of the policy ConfigMap"},
      {"barge-cronjob.yaml", "claimName: barge-targets", "claimName: barge-target", "claim barge-target is not defined"},
      // One shard's failures must not end the others (issue 36, item 7).
      {"barge-cronjob.yaml", "backoffLimitPerIndex: 2", "backoffLimit: 2", "no backoffLimitPerIndex"},
      {"barge-cronjob.yaml", "backoffLimitPerIndex: 2", "backoffLimitPerIndex: 2\n      backoffLimit: 6",
       "backoffLimit 6 counts the failures of all shards together"},
      {"barge-cronjob.yaml", "maxFailedIndexes: 3", "maxFailedIndexes: 1", "Kubernetes would stop the others"},
      {"barge-cronjob.yaml", "maxFailedIndexes: 3", "maxFailedIndexes: 4", "maxFailedIndexes 4 exceeds completions 3"},
      {"barge-cronjob.yaml", "maxFailedIndexes: 3", "maxFailedIndexes: \"3\"", "expected integer, got str"},
      // Field level: unknown keys, enumerations, required fields.
      {"barge-cronjob.yaml", "seccompProfile:", "seccompprofile:", "unknown field 'seccompprofile'"},
      {"barge-cronjob.yaml", "whenUnsatisfiable: ScheduleAnyway", "whenUnsatisfiable: Schedule",
       "'Schedule' is not one of DoNotSchedule, ScheduleAnyway"},
      {"barge-cronjob.yaml", "              image: localhost/barge:latest\n", "", "required field 'image' is missing"},
      // Pod Security: the level the namespace enforces admits the pods,
      // which meet restricted but for running as root.
      {"barge-cronjob.yaml", "type: RuntimeDefault", "type: Unconfined",
       "Pod Security baseline (namespace barge) refuses the pods: seccomp"},
      {"namespace.yaml", "enforce: baseline", "enforce: restricted",
       "Pod Security restricted (namespace barge) refuses the pods: runAsNonRoot"},
      {"namespace.yaml", "    pod-security.kubernetes.io/enforce: baseline\n", "",
       "pod-security.kubernetes.io/enforce must be baseline or restricted"},
      {"barge-cronjob.yaml", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true",
       "restricted in all but running as non-root: allowPrivilegeEscalation"},
      {"barge-cronjob.yaml", "drop: [ALL]", "drop: [NET_RAW]", "must drop ALL"},
      // No Secret of placeholders that applying would write over the real one.
      {"kustomization.yaml", "resources:\n", "secretGenerator:\n  - name: barge-nbd-tls\n    literals: [a=b]\nresources:\n",
       "a Secret generated here would replace the real one"},
      {"barge-targets.yaml", "      storage: 2Ti\n",
       "      storage: 2Ti\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: barge-nbd-tls\nstringData:\n  a: b\n",
       "Secret barge-nbd-tls is rendered by the kustomization"},
      {"barge-targets.yaml", "[ReadWriteMany]", "[ReadWriteOnce]", "must be ReadWriteMany"},
      {"barge-policy.yaml", "retention_count: 15", "retention: 15", "fails `barge policy check`"},
      {"barge-policy.yaml", "targets: [/backups/targets]", "targets: [/srv/targets]", "target /srv/targets is on no volume"},
      {"barge-policy.yaml", "        changed_by: digests\n", "", "every backup is a full (changed_by: full)"},
      {"kustomization.yaml", "  - barge-targets.yaml\n", "", "barge-targets.yaml is in the folder but not in resources"},
  };
  for (const Fault& f : faults) {
    TempDir dir;
    fs::copy(shipped, dir.path());
    const std::string path = dir / f.file;
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    size_t at = s.find(f.from);
    ASSERT_NE(at, std::string::npos) << f.file << " no longer holds " << f.from;
    s.replace(at, std::string(f.from).size(), f.to);
    std::ofstream(path, std::ios::trunc) << s;
    auto broken = CheckKubernetes(dir.path().string());
    EXPECT_EQ(broken.exit_code, 1) << f.file << ": " << f.from << " -> " << f.to << "\n" << broken.output;
    EXPECT_NE(broken.output.find(f.expect), std::string::npos)
        << f.file << ": " << f.from << " -> " << f.to << ": expected '" << f.expect << "' in\n" << broken.output;
  }
}

// The worker's command line of the CronJob, run as each of its pods would
// (JOB_COMPLETION_INDEX 0..completions-1, the manifest's environment) with
// the built barge, the pod's paths mapped into a folder here and a policy
// of local images: every pod exits 0, each source is backed up once by the
// shard it falls to, and the records folder reads as one table.
TEST(DeployTest, KubernetesWorkerCommandLineRunsEachShard) {
  BARGE_REQUIRE_TOOL("python3");
  if (testing::Run("python3 -c 'import yaml'").exit_code != 0) {
    if (testing::ToolsRequired()) FAIL() << "python3-yaml missing";
    GTEST_SKIP() << "python3-yaml missing";
  }
  auto w = testing::Run("python3 " + ShellQuote(std::string(BARGE_SOURCE_DIR) + "/tests/deploy_kubernetes_check.py") +
                        " --worker " + ShellQuote(kDeploy + "/kubernetes"));
  ASSERT_EQ(w.exit_code, 0) << w.output;
  const nlohmann::json worker = nlohmann::json::parse(w.stdout_text);
  const int completions = worker["completions"].get<int>();
  ASSERT_GE(completions, 2);

  TempDir dir;
  const std::string root = dir.path().string();
  fs::create_directories(root + "/backups/targets");
  fs::create_directories(root + "/backups/records");
  fs::create_directories(root + "/backups/metrics");
  std::string policy = "name: nightly\nschedule: \"0 2 * * *\"\ntargets: [" + root +
                       "/backups/targets]\nfree_space_multiple: 0\nsources:\n";
  for (int i = 0; i < 6; ++i) {
    const std::string image = root + "/vm" + std::to_string(i) + ".raw";
    testing::WriteFile(image, testing::RandomBytes(256 << 10, 500 + i));
    policy += "  - image: " + image + "\n";
  }
  std::ofstream(root + "/nightly.yaml") << policy;

  // The pod's paths, here.
  auto map_path = [&](std::string arg) {
    for (const std::string from : {"/etc/barge/", "/backups"}) {
      if (arg.rfind(from, 0) == 0) return root + (from == "/backups" ? arg : "/" + arg.substr(from.size()));
    }
    return arg;
  };
  std::string command = ShellQuote(testing::BargeBinary());
  for (const auto& a : worker["args"]) command += " " + ShellQuote(map_path(a.get<std::string>()));
  std::string env = "env -u SLURM_ARRAY_TASK_ID -u SLURM_ARRAY_TASK_COUNT";
  for (const auto& [k, v] : worker["env"].items()) env += " " + k + "=" + ShellQuote(v.get<std::string>());
  for (int index = 0; index < completions; ++index) {
    auto r = testing::Run(env + " JOB_COMPLETION_INDEX=" + std::to_string(index) + " " + command);
    EXPECT_EQ(r.exit_code, 0) << "pod " << index << ": " << command << "\n" << r.output;
    EXPECT_TRUE(fs::exists(root + "/backups/records/nightly.shard-" + std::to_string(index) + ".db")) << index;
    EXPECT_TRUE(fs::exists(root + "/backups/metrics/barge-nightly.shard-" + std::to_string(index) + ".prom"))
        << index;
  }
  std::map<std::string, int> assigned;
  const nlohmann::json split = testing::RunResult(testing::Barge("policy shards --json " +
                                                  ShellQuote(root + "/nightly.yaml") + " --shards " +
                                                  std::to_string(completions)));
  for (const auto& s : split["sources"]) assigned[s["name"].get<std::string>()] = s["shard"].get<int>();
  const nlohmann::json runs =
      testing::RunResult(testing::Barge("runs list --json --catalog " + ShellQuote(root + "/backups/records")))["runs"];
  std::map<std::string, int> backed_up;
  for (const auto& r : runs) {
    const std::string source = r["source"].get<std::string>();
    EXPECT_EQ(r["result"], "success") << r.dump();
    ASSERT_TRUE(r["shard"].is_object()) << r.dump();
    EXPECT_EQ(r["shard"]["index"].get<int>(), assigned[source]) << r.dump();
    EXPECT_EQ(r["shard"]["count"].get<int>(), completions) << r.dump();
    backed_up[source] += 1;
  }
  EXPECT_EQ(backed_up.size(), 6u) << runs.dump(1);
  for (const auto& [source, n] : backed_up) EXPECT_EQ(n, 1) << source;
}

// The Containerfile builds from Debian 12 with the project's scripts, and
// its runtime stage installs the package of every library the built barge
// needs (dpkg -S on this machine, also Debian 12).
TEST(DeployTest, ContainerfileCoversTheBinarysLibraries) {
  BARGE_REQUIRE_TOOL("dpkg");
  BARGE_REQUIRE_TOOL("objdump");
  std::string file = RunOk("cat " + ShellQuote(kDeploy + "/container/Containerfile"));
  EXPECT_NE(file.find("FROM debian:12 AS build"), std::string::npos);
  EXPECT_NE(file.find("scripts/deps.sh build"), std::string::npos);
  EXPECT_NE(file.find("scripts/build.sh"), std::string::npos);
  const size_t runtime = file.find("\nFROM debian:12\n");
  ASSERT_NE(runtime, std::string::npos) << "no runtime stage FROM debian:12";
  const std::string stage = file.substr(runtime);
  EXPECT_NE(stage.find("COPY --from=build"), std::string::npos);
  EXPECT_NE(stage.find("ENTRYPOINT [\"/usr/local/bin/barge\"]"), std::string::npos);
  // The packages of the binary's NEEDED libraries (dpkg knows a library by
  // its path with or without /usr, merged /usr or not); libc6 and libgcc-s1
  // are in every Debian image.
  std::string pkgs = RunOk(
      "dpkg -S $(for l in $(objdump -p " + ShellQuote(testing::BargeBinary()) + " | awk '/NEEDED/{print $2}'); do "
      "p=$(ldconfig -p | awk -v l=\"$l\" '$1==l{print $NF; exit}'); r=$(readlink -f \"$p\"); echo \"$r\" \"${r#/usr}\"; done) 2>/dev/null "
      "| cut -d: -f1 | sort -u");
  std::istringstream lines(pkgs);
  int checked = 0;
  for (std::string pkg; std::getline(lines, pkg);) {
    if (pkg.empty() || pkg == "libc6" || pkg == "libgcc-s1") continue;
    ++checked;
    EXPECT_NE(stage.find(" " + pkg + " "), std::string::npos) << "the runtime stage does not install " << pkg;
  }
  EXPECT_GE(checked, 5) << pkgs;
}

TEST(DeployTest, SlurmArrayScript) {
  const std::string script = kDeploy + "/slurm/barge-array.sbatch";
  RunOk("bash -n " + ShellQuote(script));
  EXPECT_TRUE(fs::status(script).permissions() != fs::perms::none &&
              (fs::status(script).permissions() & fs::perms::owner_exec) != fs::perms::none);
  std::string s = RunOk("cat " + ShellQuote(script));
  for (const char* want : {"#SBATCH --requeue", "#SBATCH --open-mode=append", "--shard auto",
                           "scontrol requeue \"$SLURM_JOB_ID\"", "SLURM_RESTART_COUNT", "exit $rc"}) {
    EXPECT_NE(s.find(want), std::string::npos) << want;
  }
}

}  // namespace
}  // namespace barge
