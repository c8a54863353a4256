// A remote hypervisor over ssh: an sshd of the test's own on 127.0.0.1 (keys
// made by the test, root by key only), libvirt's ssh transport through it to
// the test libvirtd, and vm backups whose NBD export barge forwards over ssh
// (orchestrate/libvirt/ssh_forward.h). Every point is restored and compared
// with the disk; the forward's ssh process and socket are gone afterwards.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

int FreeTcpPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool Accepts(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

bool ProcessExists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// The command lines of every process, by PID (/proc).
std::map<pid_t, std::string> Processes() {
  std::map<pid_t, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // A process may exit between the listing and the read, and then the
    // read fails with ESRCH, which the stream buffer throws.
    std::string cmd;
    try {
      std::ifstream f(e.path() / "cmdline");
      cmd.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } catch (const std::ios_base::failure&) {
      continue;
    }
    for (char& c : cmd) {
      if (c == '\0') c = ' ';
    }
    if (!cmd.empty()) out[std::stoi(name)] = cmd;
  }
  return out;
}

// sshd on 127.0.0.1:port() with a host key and a root user key made here,
// root login by that key only, no PAM; run directly (`sshd -D -f CONFIG`,
// no systemd) and stopped by PID in the destructor, its keys deleted with
// the folder. `allow_stream_local` false: unix socket forwards refused
// (AllowStreamLocalForwarding no), as a hardened host may have it.
class TestSshd {
 public:
  explicit TestSshd(const TempDir& dir, bool allow_stream_local = true) : dir_(dir / "sshd") {
    fs::create_directories(dir_);
    ::chmod(dir_.c_str(), 0700);
    RunOk("ssh-keygen -q -t ed25519 -N '' -f " + ShellQuote(dir_ + "/host_key"));
    RunOk("ssh-keygen -q -t ed25519 -N '' -f " + ShellQuote(user_key()));
    fs::copy_file(user_key() + ".pub", dir_ + "/authorized_keys");
    fs::create_directories("/run/sshd");  // privilege separation folder sshd checks for
    port_ = FreeTcpPort();
    std::ofstream(dir_ + "/sshd_config") << "ListenAddress 127.0.0.1\nPort " << port_ << "\nHostKey " << dir_
                                          << "/host_key\nPidFile " << dir_ << "/sshd.pid\nAuthorizedKeysFile "
                                          << dir_ << "/authorized_keys\nPermitRootLogin prohibit-password\n"
                                          << "PubkeyAuthentication yes\nPasswordAuthentication no\n"
                                          << "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                                          << "AllowStreamLocalForwarding " << (allow_stream_local ? "yes" : "no")
                                          << "\nStreamLocalBindUnlink yes\n";
    const std::string config = dir_ + "/sshd_config";
    const std::string log = dir_ + "/sshd.log";
    pid_ = ::fork();
    if (pid_ == 0) {
      // Not holding the test's output open, and gone with the test if it
      // dies, so ctest never waits on an orphaned sshd.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl("/usr/sbin/sshd", "/usr/sbin/sshd", "-D", "-f", config.c_str(), "-E", log.c_str(), nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !Accepts(port_); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~TestSshd() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      EXPECT_FALSE(ProcessExists(pid_)) << "sshd " << pid_ << " still runs";
    }
    // The host key libvirt's ssh (no_verify) recorded for this port.
    Run("ssh-keygen -R '[127.0.0.1]:" + std::to_string(port_) + "' >/dev/null 2>&1; rm -f /root/.ssh/known_hosts.old");
    fs::remove_all(dir_);
  }
  bool ready() const { return pid_ > 0 && Accepts(port_); }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string user_key() const { return dir_ + "/user_key"; }
  std::string log() const {
    std::ifstream f(dir_ + "/sshd.log");
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

 private:
  std::string dir_;
  int port_ = -1;
  pid_t pid_ = -1;
};

class VmRemoteSshTest : public VmTestBase {
 protected:
  void SetUp() override {
    VmTestBase::SetUp();
    if (IsSkipped()) return;
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("ssh");
    BARGE_REQUIRE_TOOL("ssh-keygen");
    BARGE_REQUIRE_TOOL("/usr/sbin/sshd");
    BARGE_REQUIRE_TOOL("virt-ssh-helper");  // libvirt's remote end of qemu+ssh:// (libvirt-daemon)
  }
  // An ssh wrapper for the URI's command=: the forward (its arguments hold
  // ExitOnForwardFailure) touches `started` and hangs before it gets to
  // ssh; libvirt's own connection runs ssh as usual.
  static void WriteHangingForwardWrapper(const std::string& wrapper, const std::string& started) {
    std::ofstream(wrapper) << "#!/bin/sh\ncase \"$*\" in *ExitOnForwardFailure*) : > '" << started
                           << "'; while :; do sleep 0.05; done ;; esac\nexec ssh \"$@\"\n";
    fs::permissions(wrapper, fs::perms::owner_all);
  }
  // The job sockets libvirt made for `domain` on the "host" (this machine's
  // /tmp: the simulated hypervisor shares it).
  static std::vector<std::string> RemoteSockets(const std::string& domain) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator("/tmp")) {
      if (e.path().filename().string().rfind("barge-backup-" + domain + "-", 0) == 0) out.push_back(e.path());
    }
    return out;
  }
  std::string Raw(const std::string& image, const std::string& name) {
    std::string out = dir_ / name;
    RunOk("qemu-img convert -U -O raw " + ShellQuote(image) + " " + ShellQuote(out));
    return out;
  }
};

TEST_F(VmRemoteSshTest, FullAndIncrementalThroughSshRestoreByteIdentical) {
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string uri = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) +
                          "/system?keyfile=" + sshd.user_key() + "&no_verify=1&proxy=native";
  const std::string connect = " --connect " + ShellQuote(uri);

  std::string disk = dir_ / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 64M");
  TestDomain dom("ssh", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name() + connect));

  // barge's own temporary folder for the forward: watched for the ssh
  // process (by the PIDs whose command line names it) and left empty.
  const std::string tmp = dir_ / "barge-tmp";
  fs::create_directories(tmp);
  std::set<pid_t> forwards;
  // The job's socket folders seen on the "host" while the backups ran, by
  // path: "dir MODE" (with the socket in it once QEMU made it) or what else
  // was there.
  std::map<std::string, std::string> socket_places;
  auto backup = [&](const std::string& extra) {
    std::atomic<bool> done{false};
    std::thread watch([&] {
      while (!done) {
        for (const auto& [pid, cmd] : Processes()) {
          if (cmd.find("ExitOnForwardFailure") != std::string::npos && cmd.find(tmp) != std::string::npos) {
            forwards.insert(pid);
          }
        }
        for (const std::string& p : RemoteSockets(dom.name())) {
          struct stat st {};
          if (::lstat(p.c_str(), &st) != 0) continue;
          char mode[8];
          std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
          std::string& seen = socket_places[p];
          if (!S_ISDIR(st.st_mode)) seen = "not a folder";
          else if (seen.empty() || seen.find("nbd.sock") == std::string::npos)
            seen = "dir " + std::string(mode) + (fs::is_socket(p + "/nbd.sock") ? " nbd.sock" : "");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    json r = RunResult("TMPDIR=" + ShellQuote(tmp) + " " +
                       Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                             " --skip-quiesce" + connect + extra) +
                       " --json");
    done = true;
    watch.join();
    return r;
  };

  // A first backup here, through the local libvirt: the tracker's
  // checkpoint lives on this machine.
  dom.Write(0xee, "1M", "4M");
  json local = Backup(dom.name());
  EXPECT_EQ(local["backup_type"], "full") << local.dump();
  dom.Flush();
  std::string p0 = Raw(disk, "p0.raw");
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"]["host"], "");

  // Through ssh: another host as far as barge can tell, so a full that says
  // so; the tracker then names that host.
  dom.Write(0x5a, "50M", "64k");
  json b1 = backup("");
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();
  EXPECT_EQ(b1["mode"], "pull");
  const std::string host = "host 127.0.0.1";  // no port: ssh and tls to one host are one host
  EXPECT_NE(b1["reason"].get<std::string>().find("is on this machine, this backup connects to " + host),
            std::string::npos)
      << b1.dump();
  dom.Flush();
  std::string p1 = Raw(disk, "p1.raw");
  json shown = BargeJson("tracker show t1")["tracker"]["latest_checkpoint"];
  EXPECT_EQ(shown["name"], b1["checkpoint"]);
  EXPECT_NE(shown["host"].get<std::string>().find("qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port())),
            std::string::npos)
      << shown.dump();

  // Incremental through ssh, from the checkpoint on that host.
  dom.Write(0xaa, "10M", "1M");
  dom.Write(0x00, "1M", "64k");
  json b2 = backup("");
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_LE(b2["disks"][0]["bytes_read"].get<uint64_t>(), 2u << 20) << b2.dump();
  dom.Flush();
  std::string p2 = Raw(disk, "p2.raw");

  // A local backup now: the checkpoint is on the ssh "host", so a full again.
  json back = BargeJson("doctor --domain " + dom.name());
  EXPECT_EQ(back["next_backup"][0]["backup_type"], "full") << back.dump();

  const std::string chain = target_ + "/" + dom.name() + "/vda";
  ExpectRestores(chain, 0, p0);
  ExpectRestores(chain, 1, p1);
  ExpectRestores(chain, 2, p2);

  // The forward ran (one ssh per backup), was stopped by PID, and left
  // neither its socket nor its folder.
  EXPECT_EQ(forwards.size(), 2u);
  for (pid_t pid : forwards) EXPECT_FALSE(ProcessExists(pid)) << "ssh forward " << pid << " still runs";
  EXPECT_TRUE(fs::is_empty(tmp)) << "left in barge's temporary folder";
  // Nor the job's socket on the "remote" host (libvirt's, in /tmp).
  for (const auto& e : fs::directory_iterator("/tmp")) {
    EXPECT_EQ(e.path().filename().string().find("barge-backup-" + dom.name()), std::string::npos) << e.path();
  }
  EXPECT_FALSE(fs::exists("/var/tmp/barge-scratch-" + dom.name() + "-vda.qcow2"));
  // The job's socket was in a folder of its own, one per run, made fresh
  // for QEMU (0750: its user and group alone), its name not guessable (128
  // random bits after the domain's name), and gone with the run.
  EXPECT_EQ(socket_places.size(), 2u);
  for (const auto& [path, seen] : socket_places) {
    EXPECT_TRUE(seen == "dir 0750 nbd.sock" || seen == "dir 0700 nbd.sock") << path << ": " << seen;
    EXPECT_GE(path.size() - ("/tmp/barge-backup-" + dom.name() + "-").size(), 32u) << path;
    EXPECT_FALSE(fs::exists(path)) << path;
  }

  // doctor through the same URI: the tracker's checkpoint, and an
  // incremental next.
  json doc = BargeJson("doctor --domain " + dom.name() + connect);
  EXPECT_EQ(doc["domain"], dom.name());
  EXPECT_EQ(doc["trackers"][0]["latest_checkpoint"]["name"], b2["checkpoint"]);
  EXPECT_EQ(doc["next_backup"][0]["backup_type"], "incremental") << doc.dump();
  std::string text = RunOk(Barge("doctor --domain " + dom.name() + connect));
  EXPECT_NE(text.find("tracker t1: checkpoint " + b2["checkpoint"].get<std::string>()), std::string::npos) << text;
  EXPECT_NE(sshd.log().find("Accepted publickey for root"), std::string::npos) << sshd.log();

  // Snapshots of the running remote domain's disk go through QEMU (QMP
  // over libvirt's remote API): made, listed and deleted there.
  json made = BargeJson("snapshot create --name s1 --domain " + dom.name() + " --disk vda" + connect);
  EXPECT_EQ(made["mode"], "online") << made.dump();
  json listed = BargeJson("snapshot list --domain " + dom.name() + " --disk vda" + connect);
  ASSERT_EQ(listed["snapshots"].size(), 1u) << listed.dump();
  EXPECT_EQ(listed["snapshots"][0]["name"], "s1") << listed.dump();
  RunOk(BargeBinary() + " snapshot delete s1 --domain " + dom.name() + " --disk vda" + connect);
  EXPECT_EQ(BargeJson("snapshot list --domain " + dom.name() + " --disk vda" + connect)["snapshots"].size(), 0u);

  // CBT of a running remote domain is refused as a local one's is.
  json e = RunError(Barge("cbt enable --domain " + dom.name() + connect) + " --json", 1);
  EXPECT_EQ(e["code"], "InvalidArgument") << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find("is running"), std::string::npos) << e.dump();
}

// A shut-off remote domain: barge starts it paused for a pull-mode backup
// (its disks are on that host) and shuts it off again; the bitmaps QEMU
// stored on the way out give the next run its incremental. Snapshots of
// the shut-off domain's disk go through QEMU the same way (started paused,
// shut off again after each); a rename (no QEMU command) is refused.
TEST_F(VmRemoteSshTest, ShutOffDomainIsStartedPausedForItsBackup) {
  BARGE_REQUIRE_TOOL("qemu-io");
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string uri = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) +
                          "/system?keyfile=" + sshd.user_key() + "&no_verify=1&proxy=native";
  const std::string connect = " --connect " + ShellQuote(uri);
  std::string disk = dir_ / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 64M");
  TestDomain dom("sshoff", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  auto write = [&](int pattern, const std::string& offset, const std::string& length) {
    RunOk("qemu-io -f qcow2 -c 'write -P " + std::to_string(pattern) + " " + offset + " " + length + "' " +
          ShellQuote(disk) + " >/dev/null");
  };
  auto state = [&] { return RunOk(std::string(kVirsh) + "domstate " + dom.name()); };
  RunOk(Barge("tracker create t1 --domain " + dom.name() + connect));
  EXPECT_EQ(BargeJson("doctor --domain " + dom.name() + connect)["next_mode"], "pull");

  write(0x11, "0", "4M");
  const std::string backup = "vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) + connect;
  CommandResult first = ::barge::testing::Run(Barge(backup));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("started it paused for this backup"), std::string::npos) << first.output;
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();
  std::string p0 = Raw(disk, "p0.raw");

  write(0x22, "20M", "1M");
  json b1 = BargeJson(backup);
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(b1["mode"], "pull");
  EXPECT_EQ(b1["transport"], "ssh");
  EXPECT_LE(b1["disks"][0]["bytes_read"].get<uint64_t>(), 2u << 20) << b1.dump();
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();
  std::string p1 = Raw(disk, "p1.raw");

  const std::string chain = target_ + "/" + dom.name() + "/vda";
  ExpectRestores(chain, 0, p0);
  ExpectRestores(chain, 1, p1);

  const std::string snap = " --domain " + dom.name() + " --disk vda" + connect;
  CommandResult made = ::barge::testing::Run(Barge("snapshot create --name s1" + snap) + " 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_NE(made.output.find("started it paused for this snapshot operation"), std::string::npos) << made.output;
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();
  json listed = BargeJson("snapshot list" + snap);
  ASSERT_EQ(listed["snapshots"].size(), 1u) << listed.dump();
  EXPECT_EQ(listed["snapshots"][0]["name"], "s1") << listed.dump();
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();
  // QEMU wrote it into the image file: qemu-img sees it, the image is clean.
  EXPECT_NE(RunOk("qemu-img snapshot -l " + ShellQuote(disk)).find("s1"), std::string::npos);
  RunOk("qemu-img check -q " + ShellQuote(disk));
  json e = RunError(BargeBinary() + " snapshot rename s1 s2" + snap + " --json", 1);
  EXPECT_EQ(e["code"], "NotSupported") << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find("is shut off"), std::string::npos) << e.dump();
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();
  RunOk(BargeBinary() + " snapshot delete s1" + snap);
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();
  EXPECT_EQ(BargeJson("snapshot list" + snap)["snapshots"].size(), 0u);
  EXPECT_EQ(RunOk("qemu-img snapshot -l " + ShellQuote(disk)).find("s1"), std::string::npos);
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();
}

// CBT for a shut-off remote domain's raw disk: the overlay is made here and
// put beside the raw disk on the host through libvirt's storage API; the
// domain starts and runs on it, pull-mode backups over ssh take a full and
// then an incremental from the CBT bitmap, and disable brings the domain
// back on its raw disk with the overlay gone. A raw disk QEMU's user cannot
// write is refused first, with nothing changed.
TEST_F(VmRemoteSshTest, CbtEnableOnTheHostBacksUpIncrementallyAndDisables) {
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string uri = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) +
                          "/system?keyfile=" + sshd.user_key() + "&no_verify=1&proxy=native";
  const std::string connect = " --connect " + ShellQuote(uri);
  const std::string raw = dir_ / "disk.raw";
  const std::string overlay = raw + ".cbt.qcow2";
  RunOk("truncate -s 64M " + ShellQuote(raw) + " && chmod 600 " + ShellQuote(raw));
  TestDomain dom("sshcbt", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  auto state = [&] { return RunOk(std::string(kVirsh) + "domstate " + dom.name()); };
  auto source = [&](bool inactive) {
    std::istringstream in(RunOk(std::string(kVirsh) + "domblklist " + dom.name() + (inactive ? " --inactive" : "")));
    std::string target, path;
    in >> target >> path;
    return path;
  };
  const std::string before = RunOk(std::string(kVirsh) + "dumpxml --inactive " + dom.name());

  // QEMU's user (not root here) cannot write a root-owned 0600 file, and
  // barge cannot change a remote file's owner: refused, nothing changed.
  const bool qemu_is_root = RunOk(std::string(kVirsh) + "capabilities")
                                .find("<baselabel type='qemu'>+0:+0</baselabel>") != std::string::npos;
  if (!qemu_is_root) {
    json e = RunError(Barge("cbt enable --domain " + dom.name() + connect) + " --json", 1);
    EXPECT_EQ(e["code"], "InvalidArgument") << e.dump();
    EXPECT_NE(e["message"].get<std::string>().find("cannot read and write the raw disk"), std::string::npos)
        << e.dump();
    EXPECT_EQ(RunOk(std::string(kVirsh) + "dumpxml --inactive " + dom.name()), before);
    EXPECT_FALSE(fs::exists(overlay));
    EXPECT_EQ(BargeJson("cbt status --domain " + dom.name() + connect)["state"], "Disabled");
  }
  RunOk("chmod 666 " + ShellQuote(raw));

  // A file of the overlay's name that barge did not leave is not replaced;
  // one an enable cut short during its upload left (its header block still
  // zeros, so no qcow2 image) is.
  std::ofstream(overlay) << "someone else's file";
  json taken = RunError(Barge("cbt enable --domain " + dom.name() + connect) + " --json", 1);
  EXPECT_NE(taken["message"].get<std::string>().find("not replacing a file barge did not leave"), std::string::npos)
      << taken.dump();
  EXPECT_EQ(RunOk(std::string(kVirsh) + "dumpxml --inactive " + dom.name()), before);
  RunOk("rm " + ShellQuote(overlay) + " && truncate -s 1M " + ShellQuote(overlay));

  json st = BargeJson("cbt enable --domain " + dom.name() + connect);
  ASSERT_EQ(st["state"], "Enabled") << st.dump();
  EXPECT_NE(st["host"].get<std::string>().find("qemu+ssh://root@127.0.0.1"), std::string::npos) << st.dump();
  ASSERT_EQ(st["disks"].size(), 1u) << st.dump();
  EXPECT_EQ(st["disks"][0]["overlay"], overlay) << st.dump();
  EXPECT_EQ(st["disks"][0]["data_file"], raw) << st.dump();
  // The host's file: a qcow2 over the raw disk with the enabled bitmap,
  // clean for qemu-img; the definition names it.
  json info = json::parse(RunOk("qemu-img info -U --output=json " + ShellQuote(overlay)));
  EXPECT_EQ(info["format"], "qcow2") << info.dump();
  EXPECT_EQ(info["format-specific"]["data"]["data-file"], raw) << info.dump();
  EXPECT_EQ(info["virtual-size"], 64 << 20) << info.dump();
  EXPECT_NE(info.dump().find("barge-cbt"), std::string::npos) << info.dump();
  RunOk("qemu-img check -q " + ShellQuote(overlay));
  EXPECT_EQ(source(true), overlay);
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();

  // It starts and runs on the overlay; the guest's writes land in the raw
  // disk.
  RunOk(Barge("tracker create t1 --domain " + dom.name() + connect));
  dom.StartPaused();
  EXPECT_EQ(source(false), overlay);
  dom.Write(0x11, "0", "4M");
  const std::string backup =
      "vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) + " --skip-quiesce" + connect;
  json b0 = BargeJson(backup);
  EXPECT_EQ(b0["backup_type"], "full") << b0.dump();
  EXPECT_EQ(b0["transport"], "ssh") << b0.dump();
  dom.Flush();
  std::string p0 = dir_ / "p0.raw";
  RunOk("cp --sparse=always " + ShellQuote(raw) + " " + ShellQuote(p0));
  dom.Write(0x22, "20M", "1M");
  json b1 = BargeJson(backup);
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_LE(b1["disks"][0]["bytes_read"].get<uint64_t>(), 2u << 20) << b1.dump();
  dom.Flush();
  std::string p1 = dir_ / "p1.raw";
  RunOk("cp --sparse=always " + ShellQuote(raw) + " " + ShellQuote(p1));
  const std::string chain = target_ + "/" + dom.name() + "/vda";
  ExpectRestores(chain, 0, p0);
  ExpectRestores(chain, 1, p1);

  // disable refuses the running domain; shut off, it goes back on its raw
  // disk and the overlay is gone from the host; it starts on the raw disk.
  json running = RunError(Barge("cbt disable --domain " + dom.name() + connect) + " --json", 1);
  EXPECT_NE(running["message"].get<std::string>().find("is running"), std::string::npos) << running.dump();
  dom.Destroy();
  // Shut off, a backup starts it paused on the overlay: incremental from
  // the bitmaps QEMU stored on the way out (nothing changed since).
  CommandResult b2 = ::barge::testing::Run(Barge(backup) + " 2>&1");
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  EXPECT_NE(b2.output.find("started it paused for this backup"), std::string::npos) << b2.output;
  EXPECT_NE(b2.output.find("incremental"), std::string::npos) << b2.output;
  EXPECT_NE(state().find("shut off"), std::string::npos) << state();
  ExpectRestores(chain, 2, p1);
  // Not from this machine's libvirt: the record is that host's.
  json elsewhere = RunError(Barge("cbt disable --domain " + dom.name()) + " --json", 1);
  EXPECT_NE(elsewhere["message"].get<std::string>().find("was enabled on qemu+ssh://"), std::string::npos)
      << elsewhere.dump();
  EXPECT_TRUE(fs::exists(overlay));
  json off = BargeJson("cbt disable --domain " + dom.name() + connect);
  EXPECT_EQ(off["state"], "Disabled") << off.dump();
  EXPECT_EQ(source(true), raw);
  EXPECT_FALSE(fs::exists(overlay));
  EXPECT_EQ(RunOk(std::string(kVirsh) + "pool-list --all --name").find("barge-cbt"), std::string::npos);
  dom.StartPaused();
  EXPECT_EQ(source(false), raw);
  dom.Destroy();
}

// A remote enable that fails part-way leaves nothing: the overlay already
// uploaded for vda is deleted when vdb (a raw disk QEMU's user cannot
// write) is refused, the definition is unchanged, and the transient pool
// is gone.
TEST_F(VmRemoteSshTest, CbtEnableThatFailsPartWayRemovesWhatItUploaded) {
  if (RunOk(std::string(kVirsh) + "capabilities").find("<baselabel type='qemu'>+0:+0</baselabel>") !=
      std::string::npos) {
    GTEST_SKIP() << "QEMU runs as root here: every raw disk is writable for it";
  }
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string uri = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) +
                          "/system?keyfile=" + sshd.user_key() + "&no_verify=1&proxy=native";
  const std::string vda = dir_ / "a.raw", vdb = dir_ / "b.raw";
  RunOk("truncate -s 16M " + ShellQuote(vda) + " " + ShellQuote(vdb) + " && chmod 666 " + ShellQuote(vda) +
        " && chmod 600 " + ShellQuote(vdb));
  TestDomain dom("sshcbtfail", {{"vda", vda, "raw"}, {"vdb", vdb, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  const std::string before = RunOk(std::string(kVirsh) + "dumpxml --inactive " + dom.name());
  json e = RunError(Barge("cbt enable --domain " + dom.name() + " --connect " + ShellQuote(uri)) + " --json", 1);
  EXPECT_NE(e["message"].get<std::string>().find("raw disk " + vdb), std::string::npos) << e.dump();
  EXPECT_FALSE(fs::exists(vda + ".cbt.qcow2"));
  EXPECT_FALSE(fs::exists(vdb + ".cbt.qcow2"));
  EXPECT_EQ(RunOk(std::string(kVirsh) + "dumpxml --inactive " + dom.name()), before);
  EXPECT_EQ(RunOk(std::string(kVirsh) + "pool-list --all --name").find("barge-cbt"), std::string::npos);
  EXPECT_EQ(BargeJson("cbt status --domain " + dom.name() + " --connect " + ShellQuote(uri))["state"], "Disabled");
}

// The error path: a run that fails after reading (the request's fault
// seam, in this process) stops its ssh forward by PID before it returns,
// leaves no socket or folder, and the tracker where it was.
TEST_F(VmRemoteSshTest, FailedRunStopsItsForward) {
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string uri = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) +
                          "/system?keyfile=" + sshd.user_key() + "&no_verify=1&proxy=native";
  std::string disk = dir_ / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 64M");
  TestDomain dom("sshfail", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name() + " --connect " + ShellQuote(uri)));
  dom.Write(0xee, "1M", "4M");

  const std::string tmp = dir_ / "barge-tmp";
  fs::create_directories(tmp);
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved = old_tmp ? old_tmp : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);  // where SshForward makes its folder
  std::set<pid_t> forwards;
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) {
      for (const auto& [pid, cmd] : Processes()) {
        if (cmd.find("ExitOnForwardFailure") != std::string::npos && cmd.find(tmp) != std::string::npos) {
          forwards.insert(pid);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  FailVmBackupOnce fault(orchestrate::VmBackupFaults::Point::kAfterRead);
  orchestrate::VmBackupRequest req = VmRequest(dom.name(), target_);
  req.libvirt_uri = uri;
  req.faults = &fault;
  auto run = orchestrate::RunVmBackup(Env::Default(), req);
  done = true;
  watch.join();
  if (old_tmp) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");

  ASSERT_FALSE(run.ok());
  EXPECT_TRUE(fault.fired());
  EXPECT_NE(run.error().message().find("injected fault after reading"), std::string::npos) << run.error().ToString();
  EXPECT_EQ(forwards.size(), 1u);
  for (pid_t pid : forwards) EXPECT_FALSE(ProcessExists(pid)) << "ssh forward " << pid << " still runs";
  EXPECT_TRUE(fs::is_empty(tmp)) << "left in barge's temporary folder";
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"], nullptr);
}

// SIGINT while the forward starts (an ssh login that hangs: the URI's
// command= names a wrapper that, for the forward only, never gets to ssh):
// barge stops the wrapper by PID, leaves nothing, ends the job and exits 130.
TEST_F(VmRemoteSshTest, InterruptWhileTheForwardStartsStopsIt) {
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string wrapper = dir_ / "ssh-wrapper";
  const std::string started = dir_ / "forward-started";
  WriteHangingForwardWrapper(wrapper, started);
  const std::string uri = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) + "/system?keyfile=" +
                          sshd.user_key() + "&no_verify=1&proxy=native&command=" + wrapper;
  std::string disk = dir_ / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 64M");
  TestDomain dom("sshint", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name() + " --connect " + ShellQuote(uri)));

  const std::string tmp = dir_ / "barge-tmp";
  fs::create_directories(tmp);
  const std::string out = dir_ / "barge.out";
  const std::string command = "exec env TMPDIR=" + ShellQuote(tmp) + " " +
                              Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                                    " --skip-quiesce --connect " + ShellQuote(uri)) +
                              " >" + ShellQuote(out) + " 2>&1";
  pid_t barge = ::fork();
  if (barge == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 1200 && !fs::exists(started); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(started)) << "the forward never started";
  std::set<pid_t> forwards;
  for (const auto& [pid, cmd] : Processes()) {
    if (cmd.find("ExitOnForwardFailure") != std::string::npos && cmd.find(tmp) != std::string::npos) {
      forwards.insert(pid);
    }
  }
  ::kill(barge, SIGINT);
  int status = 0;
  ::waitpid(barge, &status, 0);
  std::ifstream f(out);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  EXPECT_EQ(forwards.size(), 1u);
  for (pid_t pid : forwards) EXPECT_FALSE(ProcessExists(pid)) << "ssh forward " << pid << " still runs";
  EXPECT_TRUE(fs::is_empty(tmp)) << "left in barge's temporary folder";
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"], nullptr);
  EXPECT_EQ(BargeJson("doctor --domain " + dom.name())["backup_job"]["state"], "none");
}

// barge killed outright (SIGKILL) while its remote job runs: the job, its
// socket on the host and barge's forward folder here are left behind. The
// next run aborts the job (QEMU removes the socket with it), sweeps the
// dead run's forward folder, and backs up as usual; nothing is left after.
TEST_F(VmRemoteSshTest, RunAfterKilledRemoteBackupCleansUpAndSucceeds) {
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  // The forward of the run to be killed never gets to ssh: the job is
  // surely running when the kill comes.
  const std::string wrapper = dir_ / "ssh-wrapper";
  const std::string started = dir_ / "forward-started";
  WriteHangingForwardWrapper(wrapper, started);
  const std::string base = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) + "/system?keyfile=" +
                           sshd.user_key() + "&no_verify=1&proxy=native";
  const std::string stuck_uri = base + "&command=" + wrapper;
  std::string disk = dir_ / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 64M");
  TestDomain dom("sshkill", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name() + " --connect " + ShellQuote(base)));
  dom.Write(0x3c, "2M", "2M");

  const std::string tmp = dir_ / "barge-tmp";
  fs::create_directories(tmp);
  const std::string out = dir_ / "barge.out";
  const std::string command = "exec env TMPDIR=" + ShellQuote(tmp) + " " +
                              Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                                    " --skip-quiesce --connect " + ShellQuote(stuck_uri)) +
                              " >" + ShellQuote(out) + " 2>&1";
  pid_t barge = ::fork();
  if (barge == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 1200 && !fs::exists(started); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(started)) << "the forward never started";
  ::kill(barge, SIGKILL);
  int status = 0;
  ::waitpid(barge, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  // Left behind: the job (orphaned), its socket on the host, the folder here.
  EXPECT_EQ(BargeJson("doctor --domain " + dom.name())["backup_job"]["state"], "orphaned");
  EXPECT_EQ(RemoteSockets(dom.name()).size(), 1u);
  EXPECT_FALSE(fs::is_empty(tmp));

  json r = RunResult("TMPDIR=" + ShellQuote(tmp) + " " +
                     Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                           " --skip-quiesce --connect " + ShellQuote(base)) +
                     " --json");
  EXPECT_EQ(r["backup_type"], "full") << r.dump();
  EXPECT_TRUE(RemoteSockets(dom.name()).empty()) << RemoteSockets(dom.name())[0];
  EXPECT_TRUE(fs::is_empty(tmp)) << "left in barge's temporary folder";
  EXPECT_EQ(BargeJson("doctor --domain " + dom.name())["backup_job"]["state"], "none");
  for (const auto& [pid, cmd] : Processes()) {
    EXPECT_FALSE(cmd.find("ExitOnForwardFailure") != std::string::npos && cmd.find(tmp) != std::string::npos)
        << "ssh forward " << pid << " still runs: " << cmd;
  }
  dom.Flush();
  std::string p0 = Raw(disk, "p0.raw");
  dom.Write(0x4d, "30M", "64k");
  json inc = RunResult(Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                             " --skip-quiesce --connect " + ShellQuote(base)) +
                       " --json");
  EXPECT_EQ(inc["backup_type"], "incremental") << inc.dump();
  dom.Flush();
  std::string p1 = Raw(disk, "p1.raw");
  const std::string chain = target_ + "/" + dom.name() + "/vda";
  ExpectRestores(chain, 0, p0);
  ExpectRestores(chain, 1, p1);
}

// A backup over qemu+ssh:// SIGKILLed mid-copy (its forward's ssh dies with
// it, PR_SET_PDEATHSIG) resumes on the next run as a local or TLS one does:
// the killed run's job aborted and its checkpoint kept on the host, the job
// incremental from it, the staged clusters below the first one written
// since kept. Afterwards no forward runs, barge's temporary folder is empty,
// the host has no job socket and one checkpoint, and the point is the disk.
TEST_F(VmRemoteSshTest, KilledBackupResumesOverSsh) {
  BARGE_REQUIRE_TOOL("qemu-io");
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string uri = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) +
                          "/system?keyfile=" + sshd.user_key() + "&no_verify=1&proxy=native";
  const std::string connect = " --connect " + ShellQuote(uri);
  // 24 MiB of data and 1 MiB further on (the TLS test's disk).
  std::string disk = dir_ / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 64M && qemu-io -f qcow2 -c 'write -P 0xab 0 24M' "
        "-c 'write -P 0x17 40M 1M' " + ShellQuote(disk) + " >/dev/null");
  TestDomain dom("sshresume", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create tr --domain " + dom.name() + connect));
  // The forward's folder goes to TMPDIR, read when the forward starts: the
  // child of HeldVmBackup gets it from this process (set only around the
  // fork), the next run from its command line.
  const std::string tmp = dir_ / "barge-tmp";
  fs::create_directories(tmp);
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved = old_tmp != nullptr ? old_tmp : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);

  orchestrate::VmBackupRequest req = VmRequest(dom.name(), target_);
  req.libvirt_uri = uri;
  req.copy.chunk_bytes = 1 << 20;
  {
    HeldVmBackup run(req, 1, 2);
    if (old_tmp != nullptr) {
      ::setenv("TMPDIR", saved.c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
    const bool reached = run.WaitHeld(std::chrono::milliseconds(2500));
    run.Kill();
    ASSERT_TRUE(reached) << "the child's backup never copied half of its work";
  }
  // Left behind: the job (orphaned), its socket on the host, the folder here.
  EXPECT_EQ(BargeJson("doctor --domain " + dom.name())["backup_job"]["state"], "orphaned");
  EXPECT_EQ(RemoteSockets(dom.name()).size(), 1u);
  EXPECT_FALSE(fs::is_empty(tmp));
  const std::string killed = Checkpoints(dom.name());
  EXPECT_EQ(std::count(killed.begin(), killed.end(), '\n'), 1) << killed;
  dom.Write(0x22, "12M", "64k");
  dom.Flush();

  const auto started = std::chrono::steady_clock::now();
  json b = RunResult("TMPDIR=" + ShellQuote(tmp) + " " +
                     Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                           " --skip-quiesce" + connect) +
                     " --json");
  std::cerr << "resumed over ssh in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s\n";
  EXPECT_EQ(b["backup_type"], "full") << b.dump();
  EXPECT_EQ(b["transport"], "ssh") << b.dump();
  const json& d = b["disks"][0];
  ASSERT_TRUE(d.contains("resume")) << b.dump();
  EXPECT_EQ(d["resume"]["resumed"], true) << b.dump();
  EXPECT_EQ(d["resume"]["staged_bytes"].get<uint64_t>(), 12u << 20) << b.dump();
  // Read: 12M..24M and 40M..41M of the data, not its first 12 MiB.
  EXPECT_LE(d["bytes_read"].get<uint64_t>(), 14u << 20) << b.dump();
  // The killed run's checkpoint is gone; the new one is the only one.
  EXPECT_EQ(Checkpoints(dom.name()), b["checkpoint"].get<std::string>() + "\n");
  EXPECT_TRUE(RemoteSockets(dom.name()).empty()) << RemoteSockets(dom.name())[0];
  EXPECT_TRUE(fs::is_empty(tmp)) << "left in barge's temporary folder";
  EXPECT_EQ(BargeJson("doctor --domain " + dom.name())["backup_job"]["state"], "none");
  for (const auto& [pid, cmd] : Processes()) {
    EXPECT_FALSE(cmd.find("ExitOnForwardFailure") != std::string::npos && cmd.find(tmp) != std::string::npos)
        << "ssh forward " << pid << " still runs: " << cmd;
  }
  dom.Flush();
  std::string now = Raw(disk, "now.raw");
  ExpectRestores(target_ + "/" + dom.name() + "/vda", 0, now);
  RunOk("qemu-img check -q " + ShellQuote(d["image"].get<std::string>()));
  json inc = RunResult("TMPDIR=" + ShellQuote(tmp) + " " +
                       Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                             " --skip-quiesce" + connect) +
                       " --json");
  EXPECT_EQ(inc["backup_type"], "incremental") << inc.dump();
  EXPECT_EQ(inc["parent_checkpoint"], b["checkpoint"]) << inc.dump();
}

// Issue 36 §9: an SSH server that refuses unix socket forwards
// (AllowStreamLocalForwarding no; libvirt's own connection still works).
// The run fails at once and says why (it said "server disconnected" after
// the reader's futile reconnects), and leaves no forward, folder or job.
TEST_F(VmRemoteSshTest, Issue36RefusedForwardSaysSo) {
  TestSshd sshd(dir_, /*allow_stream_local=*/false);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string connect = " --connect " + ShellQuote("qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) +
                                                         "/system?keyfile=" + sshd.user_key() + "&no_verify=1&proxy=native");
  std::string disk = dir_ / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 16M");
  TestDomain dom("sshrefused", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  const std::string tmp = dir_ / "barge-tmp";
  fs::create_directories(tmp);

  json e = RunError("TMPDIR=" + ShellQuote(tmp) + " " +
                        Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                              " --skip-quiesce" + connect) +
                        " --json",
                    1);
  const std::string message = e["message"].get<std::string>();
  EXPECT_NE(message.find("the SSH server refused to forward the NBD socket: AllowStreamLocalForwarding"),
            std::string::npos)
      << e.dump();
  EXPECT_EQ(e["code"], "NotSupported") << e.dump();
  EXPECT_EQ(message.find("server disconnected"), std::string::npos) << e.dump();
  EXPECT_TRUE(fs::is_empty(tmp)) << "left in barge's temporary folder";
  EXPECT_TRUE(RemoteSockets(dom.name()).empty());
  EXPECT_EQ(BargeJson("doctor --domain " + dom.name())["backup_job"]["state"], "none");
  for (const auto& [pid, cmd] : Processes()) {
    EXPECT_FALSE(cmd.find("ExitOnForwardFailure") != std::string::npos && cmd.find(tmp) != std::string::npos)
        << "ssh forward " << pid << " still runs: " << cmd;
  }
}

// Issue 36 §9: the forward's ssh killed mid-copy (a cut ssh session). The
// NBD reader's reconnect brings the forward back first (a new ssh on the
// same local socket, SshForward::Restore), so the backup completes and its
// point is the disk; before, the reader made 5 futile reconnects to the
// dead local socket and the backup failed.
TEST_F(VmRemoteSshTest, Issue36CutSshSessionIsRestoredAndTheBackupCompletes) {
  BARGE_REQUIRE_TOOL("qemu-io");
  TestSshd sshd(dir_);
  ASSERT_TRUE(sshd.ready()) << sshd.log();
  const std::string uri = "qemu+ssh://root@127.0.0.1:" + std::to_string(sshd.port()) +
                          "/system?keyfile=" + sshd.user_key() + "&no_verify=1&proxy=native";
  std::string disk = dir_ / "disk.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 64M && qemu-io -f qcow2 -c 'write -P 0xab 0 40M' "
        "-c 'write -P 0x17 50M 1M' " + ShellQuote(disk) + " >/dev/null");
  TestDomain dom("sshcut", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  // The forward's folder: TMPDIR of the held run's child (set around the fork).
  const std::string tmp = dir_ / "barge-tmp";
  fs::create_directories(tmp);
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved = old_tmp != nullptr ? old_tmp : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  orchestrate::VmBackupRequest req = VmRequest(dom.name(), target_);
  req.libvirt_uri = uri;
  req.copy.chunk_bytes = 1 << 20;
  // Few buffers in flight, so the reader is still reading when the run is
  // held (else it would have read everything before the cut); each
  // reconnect is noted in a file (the run is a child process).
  req.copy.memory_bytes = 4 << 20;
  const std::string reconnects = dir_ / "reconnects";
  req.copy.nbd_retry.on_reconnect = [reconnects](const NbdReconnect& r) {
    std::ofstream(reconnects, std::ios::app) << r.attempts << " " << r.reason << "\n";
  };
  std::string outcome;
  bool failed = true;
  {
    HeldVmBackup run(req, 1, 2);
    if (old_tmp != nullptr) {
      ::setenv("TMPDIR", saved.c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
    ASSERT_TRUE(run.WaitHeld()) << "the child's backup never copied half of its work";
    std::vector<pid_t> ssh;
    for (const auto& [pid, cmd] : Processes()) {
      if (cmd.find("ExitOnForwardFailure") != std::string::npos && cmd.find(tmp) != std::string::npos) {
        ssh.push_back(pid);
      }
    }
    ASSERT_EQ(ssh.size(), 1u);
    ASSERT_EQ(::kill(ssh[0], SIGKILL), 0);
    outcome = run.Release(&failed);
  }
  EXPECT_FALSE(failed) << outcome;
  std::ifstream noted(reconnects);
  const std::string reconnected((std::istreambuf_iterator<char>(noted)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(reconnected.empty()) << "the reader never lost its connection: the cut came too late";
  dom.Flush();
  ExpectRestores(target_ + "/" + dom.name() + "/vda", 0, Raw(disk, "now.raw"));
  EXPECT_TRUE(fs::is_empty(tmp)) << "left in barge's temporary folder";
  for (const auto& [pid, cmd] : Processes()) {
    EXPECT_FALSE(cmd.find("ExitOnForwardFailure") != std::string::npos && cmd.find(tmp) != std::string::npos)
        << "ssh forward " << pid << " still runs: " << cmd;
  }
}

// A URI with a password is never printed with it; a failed connection's
// error names the URI.
TEST_F(VmRemoteSshTest, ErrorsNameTheUriWithoutItsPassword) {
  const int port = FreeTcpPort();  // nothing listens there
  const std::string uri = "qemu+ssh://root:hunter2@127.0.0.1:" + std::to_string(port) + "/system?no_tty=1";
  CommandResult r = ::barge::testing::Run(Barge("doctor --domain nothing-here --connect " + ShellQuote(uri)));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.output.find("hunter2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("qemu+ssh://root@127.0.0.1:" + std::to_string(port) + "/system"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace barge::testing
