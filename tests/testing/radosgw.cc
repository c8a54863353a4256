// Radosgw: mon + osd (memstore) + radosgw as children of the test binary.
#include "tests/testing/radosgw.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "tests/testing/cli_testing.h"
#include "tests/testing/http_server.h"

namespace barge::testing {
namespace {

std::string RandomText(size_t n, std::string_view alphabet) {
  std::random_device rd;
  std::string out;
  for (size_t i = 0; i < n; ++i) out += alphabet[rd() % alphabet.size()];
  return out;
}

std::string Uuid() {
  std::string hex = RandomText(32, "0123456789abcdef");
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-4" + hex.substr(13, 3) + "-a" + hex.substr(17, 3) + "-" +
         hex.substr(20, 12);
}

}  // namespace

int Radosgw::Spawn(const std::string& command) {
  const std::string shell = "exec env " + command;  // command starts with VAR=value
  const int pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", shell.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

bool Radosgw::Fail(const std::string& d, const std::string& what) {
  failure_ = what + "\n" + Run("tail -n 20 " + ShellQuote(d) + "/log/*.log 2>&1").output;
  return false;
}

Radosgw::Radosgw() {
  // Under load a fresh cluster now and then never brings its OSD up (it
  // fails with "wrong fsid" at boot): start again from nothing, in a new
  // folder with new ports and a new fsid, up to three times.
  for (int attempt = 1; attempt <= 3; ++attempt) {
    failure_.clear();
    if (StartOnce((dir_.path() / ("try" + std::to_string(attempt))).string())) return;
    StopChild(rgw_pid_, std::chrono::seconds(10));
    StopChild(osd_pid_, std::chrono::seconds(10));
    StopChild(mon_pid_, std::chrono::seconds(10));
    rgw_pid_ = osd_pid_ = mon_pid_ = -1;
  }
}

bool Radosgw::StartOnce(const std::string& d) {
  for (const char* sub : {"mon", "osd/ceph-0", "run", "log", "rgw", "crash"}) {
    std::filesystem::create_directories(d + "/" + sub);
  }
  mon_port_ = FreeLoopbackPort();
  rgw_port_ = FreeLoopbackPort();
  const std::string fsid = Uuid();
  const std::string mon = "v1:127.0.0.1:" + std::to_string(mon_port_);
  WriteText(d + "/ceph.conf",
            "[global]\nfsid = " + fsid + "\nmon_host = " + mon +
                "\npublic_network = 127.0.0.1/32\n"
                "auth_cluster_required = none\nauth_service_required = none\nauth_client_required = none\n"
                "auth_allow_insecure_global_id_reclaim = true\n"
                "run_dir = " + d + "/run\npid_file = " + d + "/run/$name.pid\n"
                "admin_socket = " + d + "/run/$name.asok\nlog_file = " + d + "/log/$name.log\n"
                "crash_dir = " + d + "/crash\nkeyring = /dev/null\n"
                "osd_pool_default_size = 1\nosd_pool_default_min_size = 1\nosd_pool_default_pg_num = 8\n"
                "osd_pool_default_pgp_num = 8\nosd_crush_chooseleaf_type = 0\nmon_allow_pool_size_one = true\n"
                "mon_warn_on_pool_no_redundancy = false\nmon_max_pg_per_osd = 1000\n"
                "[mon]\nmon_data = " + d + "/mon/$cluster-$id\nmon_data_avail_warn = 2\nmon_data_avail_crit = 1\n"
                "[osd]\nosd_data = " + d + "/osd/$cluster-$id\nosd_objectstore = memstore\n"
                "memstore_device_bytes = 2G\nosd_max_object_name_len = 460\nosd_max_object_namespace_len = 64\n"
                "osd_class_load_list = *\nosd_class_default_list = *\n"
                "[client.rgw.t]\nrgw_frontends = beast endpoint=127.0.0.1:" + std::to_string(rgw_port_) +
                "\nrgw_data = " + d + "/rgw\nrgw_multipart_min_part_size = 65536\n");
  const std::string env = "CEPH_CONF=" + ShellQuote(d + "/ceph.conf") + " ";
  const std::string quiet = " >>" + ShellQuote(d + "/log/setup.log") + " 2>&1";
  CommandResult r = Run(env + "monmaptool --create --fsid " + fsid + " --addv a '[" + mon + "]' " +
                        ShellQuote(d + "/monmap") + quiet + " && " + env + "ceph-mon --mkfs -i a --monmap " +
                        ShellQuote(d + "/monmap") + quiet);
  if (r.exit_code != 0) {
    return Fail(d, "ceph-mon --mkfs failed");
  }
  mon_pid_ = Spawn(env + "ceph-mon -i a -f" + quiet);
  const std::string osd_uuid = Uuid();
  bool created = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!created && std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(mon_pid_, nullptr, WNOHANG) == mon_pid_) {
      mon_pid_ = -1;
      break;
    }
    created = Run(env + "timeout 10 ceph --connect-timeout 5 osd new " + osd_uuid + " 0" + quiet).exit_code == 0;
    if (!created) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (!created) {
    return Fail(d, "the monitor did not answer `ceph osd new`");
  }
  if (Run(env + "ceph-osd -i 0 --mkfs --osd-uuid " + osd_uuid + quiet).exit_code != 0) {
    return Fail(d, "ceph-osd --mkfs failed");
  }
  osd_pid_ = Spawn(env + "ceph-osd -i 0 -f" + quiet);
  if (Run(env + "timeout 30 ceph osd crush create-or-move osd.0 1.0 root=default host=localhost" + quiet).exit_code !=
      0) {
    return Fail(d, "ceph osd crush create-or-move failed");
  }
  bool osd_up = false;
  for (int i = 0; i < 60 && !osd_up; ++i) {
    osd_up = Run(env + "timeout 10 ceph osd stat -f json 2>/dev/null | grep -q '\"num_up_osds\":1'").exit_code == 0;
    if (!osd_up) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (!osd_up) {
    return Fail(d, "the OSD did not come up");
  }
  rgw_pid_ = Spawn(env + "radosgw -f -n client.rgw.t" + quiet);
  bool up = false;
  for (int i = 0; i < 1200 && !up; ++i) {  // pools are created first: up to 2 minutes
    up = ListeningOn(rgw_port_);
    if (!up) {
      if (::waitpid(rgw_pid_, nullptr, WNOHANG) == rgw_pid_) {
        rgw_pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (!up) {
    return Fail(d, "radosgw did not listen on 127.0.0.1:" + std::to_string(rgw_port_));
  }
  access_key_ = RandomText(20, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789");
  secret_key_ = RandomText(40, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789");
  if (Run(env + "timeout 60 radosgw-admin -n client.rgw.t user create --uid=barge --display-name=barge --access-key=" +
          access_key_ + " --secret-key=" + secret_key_ + quiet)
          .exit_code != 0) {
    return Fail(d, "radosgw-admin user create failed");
  }
  return true;
}

Radosgw::~Radosgw() {
  StopChild(rgw_pid_, std::chrono::seconds(10));
  StopChild(osd_pid_, std::chrono::seconds(10));
  StopChild(mon_pid_, std::chrono::seconds(10));
}

HttpOptions Radosgw::s3_options() const {
  HttpOptions o;
  o.s3.endpoint = endpoint();
  o.s3.access_key_id = access_key_;
  o.s3.secret_access_key = secret_key_;
  o.max_attempts = 3;
  o.backoff_initial_ms = 50;
  return o;
}

std::string Radosgw::client_env() const {
  return "AWS_ACCESS_KEY_ID=" + access_key_ + " AWS_SECRET_ACCESS_KEY=" + secret_key_ +
         " AWS_DEFAULT_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null ";
}

std::string Radosgw::barge_env() const {
  return "env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_ACCESS_KEY_ID=" + access_key_ +
         " AWS_SECRET_ACCESS_KEY=" + secret_key_ + " AWS_ENDPOINT_URL=" + endpoint() + " ";
}

Radosgw* SharedRadosgw() {
  static std::unique_ptr<Radosgw> shared;
  static std::once_flag once;
  std::call_once(once, [] { shared = std::make_unique<Radosgw>(); });
  return shared.get();
}

}  // namespace barge::testing
