// The fleet worker contract under a real Slurm (issue 21; docs/fleet.md):
// munged, slurmctld and slurmd started here (Debian's munge and slurm-wlm,
// a scratch slurm.conf) in a network namespace of the test's own, three
// simulated hypervisors (addresses 127.0.0.11..13 in that namespace), each
// a pair of qemu-nbd serving one disk each, and a policy of those six
// nbd:// sources run as an array of three shards with the shipped
// deploy/slurm/barge-array.sbatch. Checked: every source is backed up
// exactly once per run (the shards' records, read as one table with
// `runs list --catalog FOLDER`, and the points in each chain), the shard
// whose first attempt fails (a pre hook that fails once) is requeued by
// the script and run again by Slurm, and every point restores to the bytes
// its source had; a worker killed mid-run is requeued and its shard
// completes. Every daemon is stopped by its PID on every path, the
// namespace deleted.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::Has;
using ::barge::testing::PointIds;
using ::barge::testing::Q;
using ::barge::testing::Sh;
using ::barge::testing::Slurp;
using ::barge::testing::WriteText;

constexpr uint64_t kDiskBytes = 3 << 20;

// A folder under /var/tmp (munged, running as user munge, must reach its
// socket there whatever $TMPDIR is), removed with its contents.
class ScratchDir {
 public:
  ScratchDir() {
    char buf[] = "/var/tmp/barge-test-slurm-XXXXXX";
    if (::mkdtemp(buf) != nullptr) {
      path_ = buf;
      ::chmod(buf, 0755);
    }
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A daemon run in the foreground as our child (exec'd directly: no shell in
// between, so the PID is the daemon's), its output to `log`, stopped by its
// PID (SIGTERM, then SIGKILL after 5 s) when destroyed.
class Daemon {
 public:
  Daemon(std::vector<std::string> argv, const std::vector<std::string>& extra_env, const std::string& log) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> args, envp;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      FILE* out = std::fopen(log.c_str(), "a");
      if (out != nullptr) {
        ::dup2(::fileno(out), 1);
        ::dup2(::fileno(out), 2);
      }
      ::execvpe(args[0], args.data(), envp.data());
      ::_exit(127);
    }
  }
  ~Daemon() {
    ::barge::testing::StopChild(pid_, std::chrono::seconds(5));
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  int pid() const { return pid_; }
  // True while the process has not exited (reaps it when it has).
  bool Alive() {
    if (pid_ <= 0) return false;
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }

 private:
  int pid_ = -1;
};

// A network namespace of the test's own: lo up, and one address that is
// not loopback, without which getaddrinfo's AI_ADDRCONFIG (Slurm uses it)
// finds no IPv4 configured and resolves nothing. Deleted when destroyed.
class Netns {
 public:
  Netns() : name_("barge-slurm-" + std::to_string(::getpid())) {
    auto r = Sh("ip netns add " + name_ + " && ip -n " + name_ + " link set lo up && ip -n " + name_ +
                " addr add 10.254.0.1/32 dev lo");
    ok_ = r.exit_code == 0;
    error_ = r.output;
  }
  ~Netns() { Sh("ip netns del " + name_ + " 2>/dev/null"); }
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // Runs a program in the namespace (nsenter execs it: the PID stays its own).
  std::vector<std::string> Enter(std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"nsenter", "--net=/run/netns/" + name_});
    return argv;
  }
  std::string EnterShell() const { return "nsenter --net=/run/netns/" + name_ + " "; }

 private:
  std::string name_;
  bool ok_ = false;
  std::string error_;
};

// True once `pid` listens on addr:port (its own namespace's /proc/PID/net/tcp).
bool Listening(int pid, const std::string& addr_hex, int port) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/net/tcp");
  char want[32];
  std::snprintf(want, sizeof want, "%s:%04X", addr_hex.c_str(), port);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    if (f >> slot >> local >> remote >> state && local == want && state == "0A") return true;
  }
  return false;
}

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return pred();
}

// One array task as `scontrol show job -o` shows it.
struct Task {
  int array_task = -1;
  std::string state;
  int restarts = 0;
  std::string exit_code;
};

std::map<std::string, std::string> Fields(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream words(line);
  for (std::string w; words >> w;) {
    size_t eq = w.find('=');
    if (eq != std::string::npos) fields[w.substr(0, eq)] = w.substr(eq + 1);
  }
  return fields;
}

bool Terminal(const std::string& state) {
  static const std::set<std::string> done = {"COMPLETED", "FAILED",   "CANCELLED",     "TIMEOUT",
                                             "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
                                             "DEADLINE"};
  return done.count(state) != 0;
}

struct Source {
  std::string name;
  std::string host;  // the hypervisor's address in the namespace
  int port;
  std::string disk;  // the raw file its qemu-nbd serves
};

class SlurmFleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* tool : {"sbatch", "scontrol", "sinfo", "scancel", "slurmctld", "slurmd", "munged", "mungekey",
                             "setpriv", "nsenter", "ip", "qemu-nbd"}) {
      BARGE_REQUIRE_TOOL(tool);
    }
    if (::geteuid() != 0) {
      if (testing::ToolsRequired()) FAIL() << "the Slurm test runs as root (munged as user munge, a netns)";
      GTEST_SKIP() << "not root: munged as user munge and a network namespace need root";
    }
    ASSERT_FALSE(dir_.path().empty());
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    host_ = std::string(host).substr(0, std::string(host).find('.'));

    netns_ = std::make_unique<Netns>();
    ASSERT_TRUE(netns_->ok()) << netns_->error();

    // Three hypervisors, two disks each.
    const char* hv_addr[] = {"127.0.0.11", "127.0.0.12", "127.0.0.13"};
    const char* hv_hex[] = {"0B00007F", "0C00007F", "0D00007F"};
    for (int h = 0; h < 3; ++h) {
      for (int d = 0; d < 2; ++d) {
        Source s{"hv" + std::to_string(h + 1) + "-vm" + std::to_string(d), hv_addr[h],
                 10809 + d, dir_ / ("hv" + std::to_string(h + 1) + "-disk" + std::to_string(d) + ".raw")};
        // Data, then a zero tail (a hole for the reader to notice).
        auto bytes = testing::RandomBytes(kDiskBytes, 2100 + h * 10 + d);
        std::fill(bytes.begin() + (2 << 20), bytes.end(), std::byte{0});
        testing::WriteFile(s.disk, bytes);
        nbd_.push_back(std::make_unique<Daemon>(
            netns_->Enter({"qemu-nbd", "-f", "raw", "-r", "-t", "-e", "4", "-b", s.host, "-p",
                           std::to_string(s.port), "-x", "disk", s.disk}),
            std::vector<std::string>{}, dir_ / "qemu-nbd.log"));
        const int pid = nbd_.back()->pid();
        const int port = s.port;
        const std::string hex = hv_hex[h];
        ASSERT_TRUE(WaitFor([&] { return Listening(pid, hex, port); }, std::chrono::seconds(10)))
            << "qemu-nbd " << s.host << ":" << s.port << "\n" << Slurp(dir_ / "qemu-nbd.log");
        sources_.push_back(s);
      }
    }

    // munge: a key of our own, munged as user munge on a socket of our own.
    const std::string munge = dir_ / "munge";
    fs::create_directories(munge + "/key");
    ASSERT_EQ(Sh("mungekey -c -k " + Q(munge + "/key/munge.key")).exit_code, 0);
    ASSERT_EQ(Sh("chown -R munge:munge " + Q(munge) + " && chmod 0755 " + Q(munge) + " && chmod 0700 " +
                 Q(munge + "/key") + " && chmod 0400 " + Q(munge + "/key/munge.key"))
                  .exit_code,
              0);
    munge_socket_ = munge + "/munge.sock";
    munged_ = std::make_unique<Daemon>(
        std::vector<std::string>{"setpriv", "--reuid=munge", "--regid=munge", "--clear-groups", "munged", "-F",
                                 "--key-file=" + munge + "/key/munge.key", "--socket=" + munge_socket_,
                                 "--pid-file=" + munge + "/munged.pid", "--log-file=" + munge + "/munged.log",
                                 "--seed-file=" + munge + "/munged.seed"},
        std::vector<std::string>{}, dir_ / "munged.out");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(munge_socket_); }, std::chrono::seconds(10)))
        << Slurp(dir_ / "munged.out");

    // Slurm: a scratch slurm.conf. Its ports are the defaults, in our own
    // namespace: nothing else listens there. cred_expire=5 and
    // sched_interval=1 let a requeued task start again within seconds
    // (by default a requeued job waits cred_expire, 120 s).
    const std::string slurm = dir_ / "slurm";
    fs::create_directories(slurm + "/state");
    fs::create_directories(slurm + "/spool");
    const unsigned cpus = std::max(1u, std::min(2u, std::thread::hardware_concurrency()));
    slurm_conf_ = slurm + "/slurm.conf";
    WriteText(slurm_conf_, "ClusterName=bargetest\n"
                           "SlurmctldHost=" + host_ + "(127.0.0.1)\n"
                           "SlurmctldPort=6817\nSlurmdPort=6818\n"
                           "SlurmUser=root\nSlurmdUser=root\n"
                           "AuthType=auth/munge\nCredType=cred/munge\n"
                           "AuthInfo=socket=" + munge_socket_ + ",cred_expire=5\n"
                           "StateSaveLocation=" + slurm + "/state\nSlurmdSpoolDir=" + slurm + "/spool\n"
                           "SlurmctldPidFile=" + slurm + "/slurmctld.pid\nSlurmdPidFile=" + slurm + "/slurmd.pid\n"
                           "SlurmctldLogFile=" + slurm + "/slurmctld.log\nSlurmdLogFile=" + slurm + "/slurmd.log\n"
                           "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                           "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
                           "SchedulerType=sched/builtin\nSchedulerParameters=sched_interval=1\n"
                           "MpiDefault=none\nJobAcctGatherType=jobacct_gather/none\n"
                           "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
                           "ReturnToService=2\n"
                           "NodeName=" + host_ + " NodeAddr=127.0.0.1 CPUs=" + std::to_string(cpus) +
                           " State=UNKNOWN\n"
                           "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
    const std::vector<std::string> env = {"SLURM_CONF=" + slurm_conf_};
    slurmctld_ = std::make_unique<Daemon>(netns_->Enter({"slurmctld", "-D"}), env, dir_ / "slurmctld.out");
    slurmd_ = std::make_unique<Daemon>(netns_->Enter({"slurmd", "-D"}), env, dir_ / "slurmd.out");
    ASSERT_TRUE(WaitFor([&] { return Has(Slurm("sinfo -h -o %T").output, "idle"); }, std::chrono::seconds(20)))
        << Slurp(dir_ / "slurmctld.out") << Slurp(dir_ / "slurmd.out") << Slurm("sinfo").output;
    slurm_up_ = true;

    fs::create_directories(dir_ / "target");
    fs::create_directories(dir_ / "records");
    fs::create_directories(dir_ / "out");
    fs::create_directories(dir_ / "metrics");
  }

  void TearDown() override {
    // Jobs first (their slurmstepd belong to slurmd), then the daemons by
    // their PIDs, newest first; the namespace last.
    if (slurm_up_) {
      Slurm("scancel --quiet --user=root");
      WaitFor([&] { return Slurm("squeue -h -o %i").output.empty(); }, std::chrono::seconds(10));
    }
    slurmd_.reset();
    slurmctld_.reset();
    munged_.reset();
    nbd_.clear();
    netns_.reset();
  }

  // A Slurm client command in the namespace, with our slurm.conf.
  testing::CommandResult Slurm(const std::string& command) {
    return Sh("SLURM_CONF=" + Q(slurm_conf_) + " timeout 5 " + netns_->EnterShell() + command + " 2>&1");
  }

  // hv2-vm1's first attempt fails: its shard's task fails.
  std::string FailOnceHook() {
    return "if [ \"$BARGE_SOURCE\" = hv2-vm1 ] && [ ! -e " + dir_ / "hv2-vm1.failed-once" + " ]; then touch " +
           dir_ / "hv2-vm1.failed-once" + "; echo hv2-vm1 fails its first attempt; exit 1; fi";
  }

  void WritePolicy(const std::string& reason, const std::string& pre_hook) {
    std::string text = "name: fleet\n"
                       "reason: \"" + reason + "\"\n"
                       "schedule: \"0 2 * * *\"\n"
                       "targets: [" + dir_ / "target" + "]\n"
                       "free_space_multiple: 0\n"
                       "retention_count: 10\n"
                       "pre_hook: '" + pre_hook + "'\n"
                       "sources:\n";
    for (const Source& s : sources_) {
      text += "  - nbd: nbd://" + s.host + ":" + std::to_string(s.port) + "/disk\n    name: " + s.name + "\n";
    }
    WriteText(policy_, text);
  }

  // Submits the shipped array script (3 shards) and waits for every task
  // to end; returns them by array index.
  std::map<int, Task> RunArray(const std::string& out_name) { return WaitArray(SubmitArray(out_name)); }

  // Submits the array; returns its job id.
  std::string SubmitArray(const std::string& out_name) {
    const std::string script = std::string(BARGE_SOURCE_DIR) + "/deploy/slurm/barge-array.sbatch";
    auto sub = Sh("SLURM_CONF=" + Q(slurm_conf_) + " BARGE=" + Q(testing::BargeBinary()) +
                  " BARGE_RECORDS=" + Q(dir_ / "records") + " BARGE_MAX_RETRIES=2 timeout 10 " +
                  netns_->EnterShell() + "sbatch --parsable --array=0-2 --chdir=" + Q(dir_.path()) +
                  " --output=" + Q(dir_ / ("out/" + out_name + "-%a.out")) + " " + Q(script) + " " + Q(policy_) +
                  // After the policy: options of barge run, passed on.
                  " --metrics-textfile " + Q(dir_ / "metrics/barge-fleet.prom"));
    EXPECT_EQ(sub.exit_code, 0) << sub.output;
    return sub.stdout_text.substr(0, sub.stdout_text.find_first_of(";\n"));
  }

  // Waits for every task of the array `job` to end.
  std::map<int, Task> WaitArray(const std::string& job) {
    std::map<int, Task> tasks;
    const bool done = WaitFor(
        [&] {
          tasks.clear();
          std::istringstream lines(Slurm("scontrol show job -o " + job).output);
          for (std::string line; std::getline(lines, line);) {
            auto f = Fields(line);
            if (f.count("ArrayTaskId") == 0) continue;
            Task t;
            try {
              t.array_task = std::stoi(f["ArrayTaskId"]);  // "0-2" while not split: stoi reads 0
            } catch (...) {
              continue;
            }
            if (f["ArrayTaskId"].find_first_not_of("0123456789") != std::string::npos) return false;
            t.state = f["JobState"];
            t.restarts = std::atoi(f["Restarts"].c_str());
            t.exit_code = f["ExitCode"];
            tasks[t.array_task] = t;
          }
          if (tasks.size() != 3) return false;
          for (auto& [i, t] : tasks) {
            if (!Terminal(t.state)) return false;
          }
          return true;
        },
        std::chrono::seconds(90));  // generous: the whole suite may run beside it
    EXPECT_TRUE(done) << "array " << job << " did not end: " << Slurm("scontrol show job -o " + job).output
                      << Slurp(dir_.path() + "/slurm/slurmctld.log");
    return tasks;
  }

  std::string TaskOutput(const std::string& out_name, int index) {
    const std::string path = dir_ / ("out/" + out_name + "-" + std::to_string(index) + ".out");
    return fs::exists(path) ? Slurp(path) : "(no output file " + path + ")";
  }

  ScratchDir dir_;
  std::string host_;
  std::string policy_ = dir_ / "fleet.yaml";
  std::string munge_socket_;
  std::string slurm_conf_;
  bool slurm_up_ = false;
  std::vector<Source> sources_;
  // Declared in start order; TearDown stops them in reverse.
  std::unique_ptr<Netns> netns_;
  std::vector<std::unique_ptr<Daemon>> nbd_;
  std::unique_ptr<Daemon> munged_;
  std::unique_ptr<Daemon> slurmctld_;
  std::unique_ptr<Daemon> slurmd_;
};

// The shard index of a record of `runs list --json` (-1: not sharded).
int ShardOf(const json& record) {
  return record.contains("shard") && record["shard"].is_object() ? record["shard"].value("index", -1) : -1;
}

TEST_F(SlurmFleetTest, ArrayOfThreeShardsBacksUpEverySourceOnceRetriesAndRestores) {
  WritePolicy("first", FailOnceHook());

  // Run 1: hv2-vm1's pre hook fails once; its shard's task requeues itself.
  std::map<int, Task> run1 = RunArray("run1");
  ASSERT_EQ(run1.size(), 3u);

  // Which shard each source falls to, as barge computes it.
  std::map<std::string, int> assigned;
  const json split = testing::RunResult(Barge("policy shards --json " + Q(policy_) + " --shards 3"));
  for (const json& s : split["sources"]) {
    assigned[s.value("name", "")] = s.value("shard", -1);
  }
  ASSERT_EQ(assigned.size(), sources_.size());
  // The names are picked so that every shard has work: two sources each.
  for (const json& shard : split["shards"]) {
    EXPECT_EQ(shard["sources"].size(), 2u) << split.dump();
  }

  json runs = testing::RunResult(Barge("runs list --json --policy fleet --catalog " + Q(dir_ / "records")))["runs"];
  std::map<std::string, std::vector<json>> by_source;
  for (const json& r : runs) by_source[r.value("source", "")].push_back(r);
  int failed_shard = -1;
  for (const Source& s : sources_) {
    const auto& records = by_source[s.name];
    int ok = 0, failed = 0;
    std::set<int> shards;
    for (const json& r : records) {
      (r.value("result", "") == "success" ? ok : failed) += 1;
      shards.insert(ShardOf(r));
      if (r.value("result", "") == "failed") {
        EXPECT_TRUE(Has(r.value("error", ""), "pre_hook")) << r.dump();
      }
    }
    EXPECT_EQ(ok, 1) << s.name << " is backed up exactly once\n" << runs.dump(1);
    EXPECT_EQ(failed, s.name == "hv2-vm1" ? 1 : 0) << s.name << "\n" << runs.dump(1);
    ASSERT_EQ(shards.size(), 1u) << s.name << ": records of one source come from one shard";
    const int shard = *shards.begin();
    EXPECT_EQ(shard, assigned[s.name]) << s.name << ": backed up by the shard it falls to";
    for (const json& r : records) {
      EXPECT_TRUE(r.contains("shard") && r["shard"].is_object() && r["shard"].value("count", 0) == 3) << r.dump();
    }
    if (s.name == "hv2-vm1") failed_shard = shard;
    // One point per source, in its chain folder.
    const std::string chain = dir_ / ("target/fleet/" + s.name);
    ASSERT_TRUE(fs::is_directory(chain)) << chain;
    EXPECT_EQ(PointIds(chain).size(), 1u) << chain;
  }
  ASSERT_GE(failed_shard, 0);

  // Slurm ran every task to success; the failed shard's task twice (its
  // output, kept across the requeue, shows both attempts).
  for (auto& [index, t] : run1) {
    EXPECT_EQ(t.state, "COMPLETED") << "task " << index << "\n" << TaskOutput("run1", index);
    EXPECT_EQ(t.exit_code, "0:0") << "task " << index << "\n" << TaskOutput("run1", index);
    EXPECT_EQ(t.restarts, index == failed_shard ? 1 : 0) << "task " << index << "\n" << TaskOutput("run1", index);
  }
  // Each shard wrote its own metrics textfile, labelled with its shard.
  for (int i = 0; i < 3; ++i) {
    const std::string prom = dir_ / ("metrics/barge-fleet.shard-" + std::to_string(i) + ".prom");
    ASSERT_TRUE(fs::exists(prom)) << prom;
    EXPECT_TRUE(Has(Slurp(prom), "shard=\"" + std::to_string(i) + "/3\"")) << Slurp(prom);
  }
  const std::string retried = TaskOutput("run1", failed_shard);
  EXPECT_TRUE(Has(retried, "attempt 1 on") && Has(retried, "barge exited 1") && Has(retried, "requeued") &&
              Has(retried, "attempt 2 on") && Has(retried, "barge exited 0"))
      << retried;

  // Every point restores to its source's bytes.
  std::map<std::string, std::vector<std::byte>> first_bytes;
  for (const Source& s : sources_) {
    const std::string out = dir_ / ("restore-" + s.name + ".raw");
    testing::RunResult(Barge("restore --json " + Q(dir_ / ("target/fleet/" + s.name)) + " --to " + Q(out)));
    first_bytes[s.name] = testing::ReadFile(s.disk);
    EXPECT_TRUE(testing::ReadFile(out) == first_bytes[s.name]) << s.name << ": restored bytes differ";
    fs::remove(out);
  }

  // Run 2: a new reason makes every source due once more; hv1-a's disk
  // changed in between. No task fails now.
  {
    auto bytes = testing::RandomBytes(1 << 20, 77);
    std::fstream f(sources_[0].disk, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(512 << 10);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  WritePolicy("second", FailOnceHook());
  std::map<int, Task> run2 = RunArray("run2");
  ASSERT_EQ(run2.size(), 3u);
  for (auto& [index, t] : run2) {
    EXPECT_EQ(t.state, "COMPLETED") << TaskOutput("run2", index);
    EXPECT_EQ(t.exit_code, "0:0") << TaskOutput("run2", index);
    EXPECT_EQ(t.restarts, 0) << TaskOutput("run2", index);
  }
  runs = testing::RunResult(Barge("runs list --json --policy fleet --catalog " + Q(dir_ / "records")))["runs"];
  std::map<std::string, int> successes;
  for (const json& r : runs) {
    if (r.value("result", "") == "success") successes[r.value("source", "")] += 1;
  }
  for (const Source& s : sources_) {
    EXPECT_EQ(successes[s.name], 2) << s.name << ": once per run\n" << runs.dump(1);
    const std::string chain = dir_ / ("target/fleet/" + s.name);
    const auto ids = PointIds(chain);
    ASSERT_EQ(ids.size(), 2u) << chain;
    // The newest point holds the disk as it is now, the oldest as it was.
    const std::string latest = dir_ / ("latest-" + s.name + ".raw");
    const std::string oldest = dir_ / ("oldest-" + s.name + ".raw");
    testing::RunResult(Barge("restore --json " + Q(chain) + " --to " + Q(latest)));
    testing::RunResult(Barge("restore --json " + Q(chain) + " --at 0 --to " + Q(oldest)));
    EXPECT_TRUE(testing::ReadFile(latest) == testing::ReadFile(s.disk)) << s.name;
    EXPECT_TRUE(testing::ReadFile(oldest) == first_bytes[s.name]) << s.name;
    fs::remove(latest);
    fs::remove(oldest);
  }
  EXPECT_FALSE(testing::ReadFile(sources_[0].disk) == first_bytes[sources_[0].name]);
}

}  // namespace
}  // namespace barge

namespace barge {
namespace {

// A worker killed mid-run (SIGKILL, as the OOM killer does) while one of
// its sources is in its pre hook, holding the shard's lock and the
// source's: the script requeues the task, and Slurm's second attempt
// trips over nothing. The dead run's record becomes failed
// ("interrupted"), the source is backed up on the retry, every source once.
TEST_F(SlurmFleetTest, KilledWorkerIsRequeuedAndItsShardCompletes) {
  const std::string mark = dir_ / "hv3-vm0.hook";
  WritePolicy("first", "if [ \"$BARGE_SOURCE\" = hv3-vm0 ] && [ ! -e " + mark + " ]; then echo $PPID $$ > " + mark +
                           ".tmp && mv " + mark + ".tmp " + mark + "; sleep 60; fi");
  const std::string job = SubmitArray("killed");
  ASSERT_TRUE(WaitFor([&] { return fs::exists(mark); }, std::chrono::seconds(30)))
      << Slurm("scontrol show job -o " + job).output;
  int barge_pid = 0, hook_pid = 0;
  std::istringstream(Slurp(mark)) >> barge_pid >> hook_pid;
  ASSERT_GT(barge_pid, 1);
  ASSERT_GT(hook_pid, 1);
  ASSERT_EQ(::kill(barge_pid, SIGKILL), 0);
  // The hook ran in a process group of its own, which outlives barge: ours to end.
  ::kill(-hook_pid, SIGKILL);
  std::map<int, Task> tasks = WaitArray(job);
  ASSERT_EQ(tasks.size(), 3u);

  json runs = testing::RunResult(Barge("runs list --json --policy fleet --catalog " + Q(dir_ / "records")))["runs"];
  int killed_shard = -1;
  std::map<std::string, int> ok;
  for (const json& r : runs) {
    const std::string source = r.value("source", "");
    if (r.value("result", "") == "success") {
      ok[source] += 1;
    } else {
      EXPECT_EQ(source, "hv3-vm0") << r.dump();
      EXPECT_EQ(r.value("result", ""), "failed") << r.dump();
      EXPECT_TRUE(Has(r.value("error", ""), "interrupted")) << r.dump();
      killed_shard = ShardOf(r);
    }
  }
  ASSERT_GE(killed_shard, 0) << runs.dump(1);
  for (const Source& s : sources_) {
    EXPECT_EQ(ok[s.name], 1) << s.name << "\n" << runs.dump(1);
    EXPECT_EQ(PointIds(dir_ / ("target/fleet/" + s.name)).size(), 1u) << s.name;
  }
  for (auto& [index, t] : tasks) {
    EXPECT_EQ(t.state, "COMPLETED") << TaskOutput("killed", index);
    EXPECT_EQ(t.exit_code, "0:0") << TaskOutput("killed", index);
    EXPECT_EQ(t.restarts, index == killed_shard ? 1 : 0) << TaskOutput("killed", index);
  }
  const std::string out = TaskOutput("killed", killed_shard);
  EXPECT_TRUE(Has(out, "barge exited 137") && Has(out, "requeued") && Has(out, "attempt 2 on")) << out;
  // Nothing staged is left behind in the target.
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "target")) {
    EXPECT_FALSE(Has(e.path().filename().string(), "barge-tmp")) << e.path();
  }
  const std::string restored = dir_ / "restored.raw";
  testing::RunResult(Barge("restore --json " + Q(dir_ / "target/fleet/hv3-vm0") + " --to " + Q(restored)));
  EXPECT_TRUE(testing::ReadFile(restored) == testing::ReadFile(sources_[4].disk));
}

}  // namespace
}  // namespace barge
